package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// SIGINT (Ctrl-C) stops the server gracefully, and its log says so: that
// it is stopping, then that it stopped with the gate closed. It logs its
// version at start-up.
func TestInterruptIsLogged(t *testing.T) {
	t.Parallel()
	addr := stacktest.FreeAddr(t)
	tool := proctest.Start(t, proctest.Build(t, "github.com/idemgate/idemgate/cmd/payments-server"),
		[]string{"-listen", addr, "-dedupe", "in-process", "--", "-data-dir", t.TempDir(), "-metrics-listen="}, []string{"DATABASE_URL="})
	tool.WaitTCP(t, addr, 2*time.Minute)
	if err := tool.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := tool.Wait(time.Minute); err != nil {
		t.Fatalf("payments-server after SIGINT: %v\n%s", err, tool.Log())
	}
	log := tool.Log()
	for _, want := range []string{"payments-server starting", "version=", "msg=\"stopping", "gate closed", "msg=stopped"} {
		if !strings.Contains(log, want) {
			t.Errorf("log after SIGINT:\n%s\nwant it to hold %q", log, want)
		}
	}
	if strings.Index(log, "msg=\"stopping") > strings.Index(log, "msg=stopped") {
		t.Errorf("log:\n%s\nwant stopping before stopped", log)
	}
}

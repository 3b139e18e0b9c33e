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
// it is stopping, then that it stopped.
func TestInterruptIsLogged(t *testing.T) {
	t.Parallel()
	addr := stacktest.FreeAddr(t)
	p := proctest.Start(t, proctest.Build(t, "."), []string{"-listen", addr, "-data-dir", t.TempDir()}, nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	if err := p.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(time.Minute); err != nil {
		t.Fatalf("after SIGINT: %v\n%s", err, p.Log())
	}
	log := p.Log()
	stopping, stopped := strings.Index(log, "msg=\"stopping"), strings.Index(log, "msg=stopped")
	if stopping < 0 || stopped < stopping {
		t.Errorf("log after SIGINT:\n%s\nwant a stopping line, then stopped", log)
	}
}

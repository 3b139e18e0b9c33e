package main

import (
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
	tool.WantCleanInterrupt(t, "payments-server starting", "version=", "msg=\"stopping", "gate closed", "msg=stopped")
}

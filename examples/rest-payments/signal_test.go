package main

import (
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
	p := proctest.Start(t, proctest.Build(t, "."), []string{"-listen", addr, "-data-dir", t.TempDir(), "-caller-token-file", "tokens.txt"}, nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	p.WantCleanInterrupt(t, "msg=\"stopping", "msg=stopped")
}

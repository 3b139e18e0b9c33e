package main

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// SIGINT (Ctrl-C) stops the HTTP bridge gracefully, and its log says so:
// its version at start-up, that it is stopping, then that it stopped.
func TestInterruptIsLogged(t *testing.T) {
	t.Parallel()
	stack := stacktest.StartEmbedded(t, func(s *grpc.Server) {
		paymentsv1.RegisterPaymentsServiceServer(s, &payments.Server{Ledger: &payments.Ledger{}})
		reflection.Register(s)
	}, stacktest.Config{})
	addr := stacktest.FreeAddr(t)
	p := proctest.Start(t, proctest.Build(t, "."), []string{"-target", stack.Tool.Target(), "-plaintext", "-listen", addr}, nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	p.WantCleanInterrupt(t, "idemgate-mcp starting", "version=", "msg=\"stopping", "msg=stopped")
}

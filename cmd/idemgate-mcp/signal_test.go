package main

import (
	"strings"
	"syscall"
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
	if err := p.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(time.Minute); err != nil {
		t.Fatalf("after SIGINT: %v\n%s", err, p.Log())
	}
	log := p.Log()
	stopping, stopped := strings.Index(log, "msg=\"stopping"), strings.Index(log, "msg=stopped")
	if !strings.Contains(log, "idemgate-mcp starting") || !strings.Contains(log, "version=") || stopping < 0 || stopped < stopping {
		t.Errorf("log after SIGINT:\n%s\nwant the version at start-up, a stopping line, then stopped", log)
	}
}

package main_test

import (
	"context"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"

	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// The binary without -descriptor-set reads the tool server's services by
// server reflection, sends -token on every unary call, and forwards the key.
func TestBinaryUsesReflectionAndTheToken(t *testing.T) {
	var mu sync.Mutex
	type call struct {
		method        string
		authorization []string
	}
	var seen []call // every unary call the tool server received
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		seen = append(seen, call{info.FullMethod, md.Get("authorization")})
		mu.Unlock()
		return handler(ctx, req)
	}
	stack := stacktest.StartEmbedded(t, func(s *grpc.Server) {
		paymentsv1.RegisterPaymentsServiceServer(s, &payments.Server{Ledger: &payments.Ledger{}})
		reflection.Register(s)
	}, stacktest.Config{ToolInterceptors: []grpc.UnaryServerInterceptor{record}})

	cmd := exec.Command(proctest.Build(t, "."), "-target", stack.Tool.Target(), "-plaintext", "-token", "s3cret")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // the binary starts within it
	defer cancel()
	session, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close()
	tools, err := session.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tools.Tools) != 3 {
		t.Errorf("tools = %d, want the three payments methods", len(tools.Tools))
	}
	for i := range 2 {
		res, err := session.CallTool(ctx, &mcp.CallToolParams{
			Name:      "examples.payments.v1.PaymentsService.ChargeCard",
			Arguments: map[string]any{"customerId": "c", "amountCents": 5},
			Meta:      mcp.Meta{mcpbridge.MetaKey: "k-1"},
		})
		if err != nil || res.IsError {
			t.Fatalf("call %d: %v %+v", i, err, res)
		}
		if replayed := res.Meta[mcpbridge.MetaReplayed] == true; replayed != (i == 1) {
			t.Errorf("call %d: replayed = %v", i, replayed)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	charges := 0
	for i, c := range seen {
		if c.method == paymentsv1.PaymentsService_ChargeCard_FullMethodName {
			charges++
		}
		if len(c.authorization) != 1 || c.authorization[0] != "Bearer s3cret" {
			t.Errorf("call %d (%s): authorization = %q, want the token", i, c.method, c.authorization)
		}
	}
	// Both calls reach the tool server: its interceptors run before the
	// gate, which answers the second with the replay.
	if charges != 2 {
		t.Errorf("the tool server saw %d ChargeCard calls, want both", charges)
	}
}

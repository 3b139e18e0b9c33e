package main

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// charge_card sends nothing on a context that has already ended: the
// ledger is untouched and the tool reports the context's error.
func TestChargeCardChecksItsContext(t *testing.T) {
	l := &ledger{}
	server := newServer(l)
	server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "tools/call" {
				ended, cancel := context.WithCancel(ctx)
				cancel()
				ctx = ended
			}
			return next(ctx, method, req)
		}
	})
	ct, st := mcp.NewInMemoryTransports()
	ss, err := server.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge_card", Arguments: map[string]any{"customerId": "c1", "amountCents": 100}})
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	n := l.n
	l.mu.Unlock()
	if !res.IsError || n != 0 {
		t.Fatalf("charge_card on an ended context = %+v after %d charges, want a tool error and none", res, n)
	}
}

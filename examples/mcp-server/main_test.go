package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/mcpgate"
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

// charge_card's listed schema: orderId is the key, mirrored into the
// Mcp-Param-Idempotency-Key header at 2026-07-28 (x-mcp-header), and its
// description asks for a fresh id per intended charge, never an existing
// one (a customer id reused for a second charge would be replayed).
func TestChargeCardKeyArgument(t *testing.T) {
	ct, st := mcp.NewInMemoryTransports()
	ss, err := newServer(&ledger{}).Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if tool.Name != "charge_card" {
			continue
		}
		raw, _ := json.Marshal(tool.InputSchema)
		var schema struct {
			Properties map[string]map[string]any `json:"properties"`
		}
		if err := json.Unmarshal(raw, &schema); err != nil {
			t.Fatal(err)
		}
		order := schema.Properties["orderId"]
		if order[mcpgate.SchemaKey] != true || order["x-mcp-header"] != "Idempotency-Key" {
			t.Errorf("orderId is %v: want the key, mirrored as the Idempotency-Key header", order)
		}
		for what, text := range map[string]string{"orderId's description": fmt.Sprint(order["description"]), "the tool's description": tool.Description} {
			if !strings.Contains(text, "fresh") || !strings.Contains(text, "only to retry") {
				t.Errorf("%s does not ask for a fresh id per charge, reused only to retry it: %q", what, text)
			}
		}
		return
	}
	t.Fatal("no charge_card tool listed")
}

// A restarted server (a new ledger) never gives a charge an id the last
// process gave: the Dedupe service still replays those.
func TestChargeIDsAreThisProcesssOwn(t *testing.T) {
	in := chargeIn{CustomerID: "c1", AmountCents: 100}
	first, err := (&ledger{}).charge(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	restarted, err := (&ledger{}).charge(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if first.ChargeID == restarted.ChargeID {
		t.Errorf("two processes' first charges are both %s", first.ChargeID)
	}
}

package mcpgate_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	"github.com/idemgate/idemgate/mcpgate"
)

// A tool with a side effect runs once per key; the retry gets the stored
// result, marked replayed.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "mcpgate-example")
	defer os.RemoveAll(dir)
	store, err := sqlitestore.Open(ctx, dir) // or a client of a remote dedupesvc
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	dedupe := dedupesvc.NewInProcessClient(dedupesvc.NewServer(store, dedupesvc.WithNotifier(store)))

	server := mcp.NewServer(&mcp.Implementation{Name: "payments"}, nil)
	charges := 0
	type chargeIn struct {
		Customer string `json:"customer"`
		Amount   int    `json:"amount"`
	}
	// No annotations: MCP's defaults (not read-only, not idempotent), so gated.
	mcp.AddTool(server, &mcp.Tool{Name: "charge"}, func(ctx context.Context, _ *mcp.CallToolRequest, in chargeIn) (*mcp.CallToolResult, map[string]any, error) {
		charges++
		return nil, map[string]any{"charge_id": fmt.Sprintf("ch_%06d", charges), "amount": in.Amount}, nil
	})
	gate, err := mcpgate.New(ctx, dedupe, server)
	if err != nil {
		log.Fatal(err)
	}
	defer gate.Close(ctx)

	ct, st := mcp.NewInMemoryTransports() // or mcpgate.HTTPHandler(server), stateless streamable HTTP
	if _, err := server.Connect(ctx, st, nil); err != nil {
		log.Fatal(err)
	}
	client, err := mcp.NewClient(&mcp.Implementation{Name: "agent"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	for range 2 {
		res, err := client.CallTool(ctx, &mcp.CallToolParams{
			Name:      "charge",
			Arguments: map[string]any{"customer": "cust_17", "amount": 4200},
			Meta:      mcp.Meta{mcpgate.MetaKey: "order/17/charge"}, // the action's key, the same on every retry
		})
		if err != nil {
			log.Fatal(err)
		}
		out := res.StructuredContent.(map[string]any)
		fmt.Printf("charge_id=%v replayed=%v\n", out["charge_id"], res.Meta[mcpgate.MetaReplayed])
	}
	fmt.Println("charges:", charges)
	// Output:
	// charge_id=ch_000001 replayed=false
	// charge_id=ch_000001 replayed=true
	// charges: 1
}

// KeyReader wraps stdin as docs/mcp.md shows: its result is the Reader of an
// mcp.IOTransport, which the SDK closes when the session ends (closing
// stdin with it).
func ExampleKeyReader() {
	server := mcp.NewServer(&mcp.Implementation{Name: "payments-mcp", Version: "1"}, nil)
	run := func(ctx context.Context) error {
		return server.Run(ctx, &mcp.IOTransport{Reader: mcpgate.KeyReader(os.Stdin), Writer: os.Stdout})
	}
	_ = run
}

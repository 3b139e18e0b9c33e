package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/internal/testing/httpattack"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/mcpgate"
)

// Slowloris from one address, with more connections than the server has
// descriptors, each trickling a body: another client's call is served.
func TestSlowlorisDoesNotStopACall(t *testing.T) {
	t.Parallel()
	addr := stacktest.FreeAddr(t)
	prog, args := httpattack.WithFileLimit(160, proctest.Build(t, "."), "-listen", addr, "-data-dir", t.TempDir())
	p := proctest.Start(t, prog, args, nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	head := httpattack.Request(http.MethodPost, "/mcp", addr, []string{"Content-Type: application/json",
		"Accept: application/json, text/event-stream", "Content-Length: 1000000"}, nil)
	a := httpattack.Slowloris(context.Background(), "127.0.0.1", addr, 300, head, 10*time.Second)
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: httpattack.Client("127.0.0.2", 2*time.Minute)}, nil)
	if err != nil {
		t.Fatalf("connecting beside %d slowloris connections: %v", a.Opened.Load(), err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge_card", Arguments: map[string]any{"customerId": "c1", "amountCents": 100},
		Meta: mcp.Meta{mcpgate.MetaKey: "order-1"}})
	if err != nil || res.IsError {
		t.Fatalf("a charge beside the slowloris: %v %+v", err, res)
	}
}

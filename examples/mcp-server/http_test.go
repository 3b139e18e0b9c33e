package main

import (
	"context"
	"errors"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/mcpgate"
)

// Over HTTP on loopback the example's callers are one tenant: a charge
// runs once per key and a second client is replayed it. -listen on an
// address that is not loopback is refused: the example authenticates no
// caller.
func TestHTTPOnLoopbackOnly(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t, ".")
	out, err := exec.Command(bin, "-listen", "0.0.0.0:8081", "-data-dir", t.TempDir()).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "-listen 0.0.0.0:8081 is not a loopback address") {
		t.Errorf("-listen 0.0.0.0:8081: %v\n%s\nwant a refusal", err, out)
	}

	addr := stacktest.FreeAddr(t)
	p := proctest.Start(t, bin, []string{"-listen", addr, "-data-dir", t.TempDir()}, nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var results []*mcp.CallToolResult
	for range 2 {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: http.DefaultClient}, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge_card", Arguments: map[string]any{"customerId": "c1", "amountCents": 100},
			Meta: mcp.Meta{mcpgate.MetaKey: "order-1"}})
		_ = cs.Close()
		if err == nil && res.IsError {
			err = errors.New(res.Content[0].(*mcp.TextContent).Text)
		}
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
	}
	if results[0].Meta[mcpgate.MetaReplayed] != false || results[1].Meta[mcpgate.MetaReplayed] != true {
		t.Errorf("replayed: %v then %v, want false then true", results[0].Meta[mcpgate.MetaReplayed], results[1].Meta[mcpgate.MetaReplayed])
	}
}

package mcpgate_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/internal/mcpwire"
	"github.com/idemgate/idemgate/mcpgate"
)

// A gated server's answers over streamable HTTP are held within the answer
// budget (on by default; here one address may hold 64 KiB): a gated tool's
// 100 KB result is refused MCP_ANSWER_TOO_LARGE, the tool having run once
// and its result stored, so the retry with the same key is the stored
// result's refusal again, not a second run; over a transport without the
// budget (in memory, as stdio) the same key replays the stored result.
func TestAnswersOverTheBudgetAreNotHeld(t *testing.T) {
	var runs atomic.Int64
	server := mcp.NewServer(&mcp.Implementation{Name: "reports", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "report", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		runs.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("r", 100_000)}}}, nil
	})
	gate, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet()), mcpgate.WithSingleTenant())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gate.Close(context.Background()) })
	srv := httptest.NewServer(mcpwire.HTTPHandler(server, mcpwire.HTTPLimits{MaxAnswerBytesPerIP: 64 << 10}))
	t.Cleanup(srv.Close)
	for _, version := range versions {
		cs := connectAt(t, srv.URL, version, nil)
		for range 2 {
			e := wantReason(t, call(t, cs, "report", "report-"+version, nil), mcpgate.ReasonAnswerTooLarge)
			if e["code"] != "RESOURCE_EXHAUSTED" || runs.Load() != 1 {
				t.Errorf("at %s: %v after %d runs, want RESOURCE_EXHAUSTED after one", version, e, runs.Load())
			}
		}
		runs.Store(0)
	}
	ct, st := mcp.NewInMemoryTransports()
	ss, err := server.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	res := call(t, connect(t, ct), "report", "report-"+versions[0], nil)
	if res.IsError || !replayed(res) || len(res.Content) != 1 || len(res.Content[0].(*mcp.TextContent).Text) != 100_000 || runs.Load() != 0 {
		t.Errorf("the same key in memory: error %v, replayed %v, after %d more runs; want the stored result replayed", res.IsError, replayed(res), runs.Load())
	}
}

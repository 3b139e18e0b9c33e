package mcpgate_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

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
	srv := httptest.NewServer(mcpgate.HTTPHandler(server, mcpgate.WithMaxAnswerBytes(0, 64<<10)))
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

// The HTTP options set HTTPHandler's and HTTPMiddleware's limits: a body
// over WithMaxBodyBytes gets 413 before the tool runs, the same body within
// the default limit is served; limits that cannot work are refused when
// the handler is built, not met by a 503 on every large body later.
func TestHTTPOptionsSetTheLimits(t *testing.T) {
	var runs atomic.Int64
	server := mcp.NewServer(&mcp.Implementation{Name: "notes", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "note", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		runs.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
	})
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"note","arguments":{"text":"` + strings.Repeat("n", 20_000) + `"}}}`
	post := func(h http.Handler) int {
		srv := httptest.NewServer(h)
		defer srv.Close()
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", versions[0])
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		return res.StatusCode
	}
	if got := post(mcpgate.HTTPHandler(server, mcpgate.WithMaxBodyBytes(10_000))); got != http.StatusRequestEntityTooLarge || runs.Load() != 0 {
		t.Errorf("a 20 KB body with WithMaxBodyBytes(10_000): %d after %d runs, want 413 and no run", got, runs.Load())
	}
	if got := post(mcpgate.HTTPMiddleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) }), mcpgate.WithMaxBodyBytes(10_000))); got != http.StatusRequestEntityTooLarge || runs.Load() != 0 {
		t.Errorf("HTTPMiddleware with WithMaxBodyBytes(10_000): %d after %d runs, want 413 and no run", got, runs.Load())
	}
	if got := post(mcpgate.HTTPHandler(server)); got == http.StatusRequestEntityTooLarge {
		t.Errorf("a 20 KB body with the default 4 MiB limit: 413")
	}
	for name, opts := range map[string][]mcpgate.HTTPOption{
		"a negative body limit":                   {mcpgate.WithMaxBodyBytes(-1)},
		"a buffer below twice the body limit":     {mcpgate.WithMaxBodyBytes(20 << 20)},
		"a per-address buffer below twice a body": {mcpgate.WithMaxBufferedBytes(0, 1<<20)},
		"a negative answer budget":                {mcpgate.WithMaxAnswerBytes(-1, 0)},
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "mcpgate:") {
					t.Errorf("%s: HTTPHandler built (recovered %v), want a panic naming mcpgate", name, r)
				}
			}()
			mcpgate.HTTPHandler(server, opts...)
		}()
	}
}

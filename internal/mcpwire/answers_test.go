package mcpwire_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/internal/mcpwire"
)

// answerOf is HoldAnswers around a tool whose answer is n bytes of text,
// called as the SDK calls it for a request of the header h.
func answerOf(ctx context.Context, h http.Header, n int64) *mcp.CallToolResult {
	tool := mcpwire.HoldAnswers(func(context.Context, string, mcp.Request) (mcp.Result, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", int(n))}}}, nil
	})
	res, _ := tool(ctx, "tools/call", &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Name: "t"}, Extra: &mcp.RequestExtra{Header: h}})
	return res.(*mcp.CallToolResult)
}

// refusal is a refused answer's reason, code and retry delay, "" for an
// answer.
func refusal(res *mcp.CallToolResult) string {
	e, _ := res.Meta[mcpwire.MetaError].(map[string]any)
	if !res.IsError || e == nil {
		return ""
	}
	got := e["reason"].(string) + " " + e["code"].(string)
	if s, ok := e["retryAfterSeconds"].(float64); ok {
		got += " retry " + strconv.FormatFloat(s, 'f', -1, 64)
	}
	return got
}

// The answers held at once stay within MaxAnswerBytes, and one client
// address's within MaxAnswerBytesPerIP: while one request's answer is
// held, another from its address that would pass its share is refused
// MCP_ANSWER_BUDGET_EXHAUSTED with RetryInfo, and so is one from any
// address that would pass the total; another address's answer fits beside
// it; once the first request is done, its address's next answer fits. An
// answer larger than one address may hold is MCP_ANSWER_TOO_LARGE, with no
// RetryInfo. An answer to a request that is done, to another request than
// the context's (a stateful session's call, on the context of the request
// that opened it), or over stdio, passes unheld.
func TestHTTPMiddlewareBoundsTheAnswersHeldAtOnce(t *testing.T) {
	holding := make(chan struct{})
	release := map[string]chan struct{}{}
	var after context.Context
	var afterHeader http.Header
	live := map[string]context.Context{} // the held requests' contexts
	h := mcpwire.HTTPMiddleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.Header.Get("X-Answer"), 10, 64)
		if got := refusal(answerOf(r.Context(), r.Header, n)); got != "" {
			_, _ = w.Write([]byte(got))
			return
		}
		if hold := r.Header.Get("X-Hold"); hold != "" {
			wait := release[hold] // read before the test goes on to write the map
			live[hold] = r.Context()
			holding <- struct{}{}
			<-wait
		}
		after, afterHeader = r.Context(), r.Header
		_, _ = w.Write([]byte("held"))
	}), mcpwire.HTTPLimits{MaxAnswerBytes: 3 << 20, MaxAnswerBytesPerIP: 2 << 20})
	answer := func(from string, n int64, hold string) string {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader("{}"))
		r.RemoteAddr = from + ":40000"
		r.Header.Set("X-Answer", strconv.FormatInt(n, 10))
		r.Header.Set("X-Hold", hold)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Body.String()
	}
	held := func(from string, n int64, hold string) chan string {
		release[hold] = make(chan struct{})
		done := make(chan string, 1)
		go func() { done <- answer(from, n, hold) }()
		<-holding
		return done
	}
	const exhausted = mcpwire.ReasonAnswerBudgetExhausted + " RESOURCE_EXHAUSTED retry 1"
	a := held("192.0.2.1", 2<<20, "a")
	if got := answer("192.0.2.1", 1, ""); got != exhausted {
		t.Errorf("an answer from an address holding its share: %q, want %q", got, exhausted)
	}
	c := held("192.0.2.2", 1<<20, "c")
	if got := answer("192.0.2.3", 1, ""); got != exhausted {
		t.Errorf("an answer past the total: %q, want %q", got, exhausted)
	}
	if got, want := answer("192.0.2.4", 2<<20+1, ""), mcpwire.ReasonAnswerTooLarge+" RESOURCE_EXHAUSTED"; got != want {
		t.Errorf("an answer larger than an address's share: %q, want %q", got, want)
	}
	close(release["a"])
	if got := <-a; got != "held" {
		t.Errorf("the first answer: %q", got)
	}
	if got := answer("192.0.2.1", 2<<20, ""); got != "held" {
		t.Errorf("an answer once the first is done: %q, want it held", got)
	}
	// Another request of the same address's holding its whole share: an
	// answer to a request that is done, or to another request on its
	// context, passes.
	b := held("192.0.2.1", 2<<20, "b")
	if got := refusal(answerOf(after, afterHeader, 3<<20)); got != "" {
		t.Errorf("an answer to a request that is done: %s, want it unheld", got)
	}
	if got := refusal(answerOf(live["b"], http.Header{}, 3<<20)); got != "" {
		t.Errorf("an answer to another request than the context's: %s, want it unheld", got)
	}
	close(release["c"])
	<-c
	if got := refusal(answerOf(context.Background(), nil, 3<<20)); got != "" {
		t.Errorf("an answer over stdio: %s, want no budget", got)
	}
	close(release["b"])
	<-b
}

// HoldAnswers sees the request's budget in the tool handlers' context, as
// the SDK's stateless streamable handler serves them: a tool's answer larger
// than an address's share is refused MCP_ANSWER_TOO_LARGE, with advice
// escalate; a small one passes.
func TestHoldAnswersThroughTheSDK(t *testing.T) {
	server := mcp.NewServer(&mcp.Implementation{Name: "big", Version: "1"}, nil)
	server.AddReceivingMiddleware(mcpwire.HoldAnswers)
	server.AddTool(&mcp.Tool{Name: "echo", InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", len(req.Params.Arguments)*1000)}}}, nil
	})
	srv := httptest.NewServer(mcpwire.HTTPHandler(server, mcpwire.HTTPLimits{MaxAnswerBytesPerIP: 100 << 10}))
	t.Cleanup(srv.Close)
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"a": strings.Repeat("a", 200)}})
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := res.Meta[mcpwire.MetaError].(map[string]any); !res.IsError || e["reason"] != mcpwire.ReasonAnswerTooLarge || e["advice"] != mcpwire.AdviceEscalate {
		t.Errorf("a 200 KB answer within 100 KiB per address: %v %v, want %s", res.IsError, res.Meta, mcpwire.ReasonAnswerTooLarge)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"a": "a"}})
	if err != nil || res.IsError {
		t.Errorf("a small answer: %v %v", err, res.Meta)
	}
}

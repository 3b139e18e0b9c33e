package mcpgate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/mcpgate"
)

var order = map[string]any{"customer": "cust_17", "amount": 4200}

func TestRunsOncePerKeyAndReplaysTheSameBytes(t *testing.T) {
	f := setup(t, embeddedDedupe(t))
	first := call(t, f.client, "charge", "order-8842", order)
	second := call(t, f.client, "charge", "order-8842", order)

	if n := f.tools.charges.Load(); n != 1 {
		t.Fatalf("charges = %d, want 1", n)
	}
	if replayed(first) || !replayed(second) {
		t.Fatalf("replayed: first %v, second %v; want false, true", first.Meta, second.Meta)
	}
	if a, b := structured(t, first)["charge_id"], structured(t, second)["charge_id"]; a != b {
		t.Fatalf("charge ids %v and %v: the replay is not the stored outcome", a, b)
	}
	results := f.wire.results(t)
	raw1, raw2 := string(results[len(results)-2]), string(results[len(results)-1])
	if !strings.Contains(raw1, `"io.idemgate/replayed":false`) || !strings.Contains(raw2, `"io.idemgate/replayed":true`) {
		t.Fatalf("the wire results do not carry the mark:\n%s\n%s", raw1, raw2)
	}
	if strings.Replace(raw1, `"io.idemgate/replayed":false`, `"io.idemgate/replayed":true`, 1) != raw2 {
		t.Fatalf("the replay's bytes differ from the original's beyond the mark:\n%s\n%s", raw1, raw2)
	}
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	f := setup(t, embeddedDedupe(t))
	f.tools.hold, f.tools.started, f.tools.ended = make(chan struct{}), make(chan struct{}, 1), make(chan error, 1)

	const n = 8
	results := make([]*mcp.CallToolResult, n)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); results[0] = call(t, f.client, "charge", "order-1", order) }()
	<-f.tools.started
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = call(t, f.client, "charge", "order-1", order) }()
	}
	close(f.tools.hold)
	wg.Wait()

	if c := f.tools.charges.Load(); c != 1 {
		t.Fatalf("charges = %d, want 1", c)
	}
	want := structured(t, results[0])["charge_id"]
	for i, res := range results[1:] {
		if res.IsError {
			// Arrived before the original finished and waited past max_wait:
			// its retry gets the outcome.
			wantReason(t, res, idemgate.ReasonInFlight)
			res = call(t, f.client, "charge", "order-1", order)
		}
		if !replayed(res) || structured(t, res)["charge_id"] != want {
			t.Fatalf("duplicate %d = %+v, want the replay of %v", i+1, res, want)
		}
	}
}

func TestKeyReusedWithOtherArgumentsIsRefused(t *testing.T) {
	f := setup(t, embeddedDedupe(t))
	call(t, f.client, "charge", "order-2", order)
	res := call(t, f.client, "charge", "order-2", map[string]any{"customer": "cust_17", "amount": 9900})
	e := wantReason(t, res, idemgate.ReasonKeyReused)
	if e["code"] != "FAILED_PRECONDITION" || e["advice"] != "escalate" {
		t.Fatalf("refusal = %v, want FAILED_PRECONDITION with advice escalate", e)
	}
	// Member order, spelling and an excluded argument are not the request.
	same := call(t, f.client, "charge", "order-2", map[string]any{"amount": 4.2e3, "note": "retry 2", "customer": "cust_17"})
	if !replayed(same) {
		t.Fatalf("the same arguments, reordered, spelled 4.2e3 and with an excluded note: %+v, want the replay", same)
	}
	if c := f.tools.charges.Load(); c != 1 {
		t.Fatalf("charges = %d, want 1", c)
	}
}

func TestReadOnlyToolsAreNeverGated(t *testing.T) {
	f := setup(t, embeddedDedupe(t))
	for range 2 {
		res := call(t, f.client, "balance", "", nil)
		if res.IsError || res.Meta[mcpgate.MetaReplayed] != nil {
			t.Fatalf("balance = %+v, want a plain result", res)
		}
	}
	// Named gated, it would be a contradiction New refuses.
	_, err := mcpgate.New(context.Background(), embeddedDedupe(t), (&tools{}).newServer(), mcpgate.WithTool("balance", mcpgate.ToolPolicy{}))
	if err == nil || !strings.Contains(err.Error(), `"balance"`) {
		t.Fatalf("New with balance named gated = %v, want an error naming it", err)
	}
	if n := f.tools.balances.Load(); n != 2 {
		t.Fatalf("balance ran %d times, want 2", n)
	}
}

func TestKeylessCallsAreRefused(t *testing.T) {
	f := setup(t, embeddedDedupe(t))
	res := call(t, f.client, "charge", "", order)
	e := wantReason(t, res, idemgate.ReasonKeyMissing)
	if e["code"] != "INVALID_ARGUMENT" || e["advice"] != "fix_request" {
		t.Fatalf("refusal = %v", e)
	}
	if c := f.tools.charges.Load(); c != 0 {
		t.Fatalf("charges = %d, want 0", c)
	}
}

// The refusal's text names the tool's carriers: _meta, and the key
// arguments when the tool has them.
func TestKeylessRefusalNamesTheCarriers(t *testing.T) {
	f := setup(t, embeddedDedupe(t), mcpgate.WithTool("charge", mcpgate.ToolPolicy{KeyArgument: "orderId"}))
	res := call(t, f.client, "charge", "", order)
	e := wantReason(t, res, idemgate.ReasonKeyMissing)
	text := res.Content[0].(*mcp.TextContent).Text
	for _, s := range []string{text, fmt.Sprint(e["message"])} {
		// order_id is marked in the schema, orderId named by the policy.
		if !strings.Contains(s, `_meta["`+mcpgate.MetaKey+`"]`) || !strings.Contains(s, "arguments orderId, order_id") {
			t.Errorf("%q: want _meta and the arguments orderId and order_id named", s)
		}
	}
	if c := f.tools.charges.Load(); c != 0 {
		t.Fatalf("charges = %d, want 0", c)
	}
}

func TestKeylessFingerprintPolicy(t *testing.T) {
	f := setup(t, embeddedDedupe(t), mcpgate.WithTool("charge", mcpgate.ToolPolicy{KeylessFingerprint: true}))
	first := call(t, f.client, "charge", "", order)
	second := call(t, f.client, "charge", "", order)
	if c := f.tools.charges.Load(); c != 1 || !replayed(second) || second.Meta[mcpgate.MetaKeyDerived] != true || first.Meta[mcpgate.MetaKeyDerived] != true {
		t.Fatalf("charges %d, first %v, second %v: want one run, both marked key-derived, the second replayed", c, first.Meta, second.Meta)
	}
}

func TestStrictModeRefusesUnannotatedTools(t *testing.T) {
	dedupe := embeddedDedupe(t)
	_, err := mcpgate.New(context.Background(), dedupe, (&tools{}).newServer(), mcpgate.WithStrict())
	if err == nil || !strings.Contains(err.Error(), `"charge"`) || strings.Contains(err.Error(), `"flaky"`) {
		t.Fatalf("strict New = %v, want an error naming charge (unannotated) and not flaky (annotated)", err)
	}
	if _, err := mcpgate.New(context.Background(), dedupe, (&tools{}).newServer(), mcpgate.WithStrict(), mcpgate.WithTool("charge", mcpgate.ToolPolicy{})); err != nil {
		t.Fatalf("strict New with charge named: %v", err)
	}
}

func TestErrorResultsAreReleasedByDefault(t *testing.T) {
	f := setup(t, embeddedDedupe(t))
	if res := call(t, f.client, "flaky", "k-1", nil); !res.IsError || errInfo(res) != nil {
		t.Fatalf("first = %+v, want the tool's own error", res)
	}
	if res := call(t, f.client, "flaky", "k-1", nil); res.IsError || replayed(res) {
		t.Fatalf("retry = %+v, want a fresh run", res)
	}
	if n := f.tools.flaky.Load(); n != 2 {
		t.Fatalf("flaky ran %d times, want 2", n)
	}
}

func TestErrorResultsReplayWhenTheToolSaysSo(t *testing.T) {
	f := setup(t, embeddedDedupe(t), mcpgate.WithTool("flaky", mcpgate.ToolPolicy{ReplayErrors: true}))
	call(t, f.client, "flaky", "k-1", nil)
	res := call(t, f.client, "flaky", "k-1", nil)
	if !res.IsError || !replayed(res) || errInfo(res) != nil {
		t.Fatalf("retry = %+v, want the stored error replayed", res)
	}
	if n := f.tools.flaky.Load(); n != 1 {
		t.Fatalf("flaky ran %d times, want 1", n)
	}
}

// A caller that gives up (cancels its request) while the tool runs does not
// cancel the tool, and its retry gets the outcome instead of a second run.
func TestACallerThatGivesUpDoesNotCauseASecondRun(t *testing.T) {
	f := setup(t, embeddedDedupe(t))
	f.tools.hold, f.tools.started, f.tools.ended = make(chan struct{}), make(chan struct{}, 1), make(chan error, 1)

	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := f.client.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: order, Meta: mcp.Meta{mcpgate.MetaKey: "order-3"}})
		gaveUp <- err
	}()
	<-f.tools.started
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller's call = %v, want it cancelled", err)
	}
	// While the tool still runs, a retry waits and gets IN_FLIGHT at worst.
	if res := call(t, f.client, "charge", "order-3", order); !res.IsError || errInfo(res)["reason"] != idemgate.ReasonInFlight {
		if !replayed(res) {
			t.Fatalf("retry while running = %+v, want IN_FLIGHT", res)
		}
	}
	close(f.tools.hold)
	if err := <-f.tools.ended; err != nil {
		t.Fatalf("the tool's context ended with %v: the caller's cancellation reached it", err)
	}
	var res *mcp.CallToolResult
	for res = call(t, f.client, "charge", "order-3", order); res.IsError; res = call(t, f.client, "charge", "order-3", order) {
		wantReason(t, res, idemgate.ReasonInFlight) // the Finish may still be on its way
	}
	if !replayed(res) || f.tools.charges.Load() != 1 {
		t.Fatalf("retry = %+v after %d charges, want the replay of the one charge", res, f.tools.charges.Load())
	}
}

// A tool that reports its provider call timed out leaves the outcome unknown:
// under FAIL_CLOSED, the caller and every retry get OUTCOME_UNKNOWN.
func TestAnUnknownOutcomeFailsClosed(t *testing.T) {
	dedupe := embeddedDedupe(t)
	server := mcp.NewServer(&mcp.Implementation{Name: "s"}, nil)
	var runs int
	mcp.AddTool(server, &mcp.Tool{Name: "send"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		runs++
		return nil, nil, context.DeadlineExceeded
	})
	if _, err := mcpgate.New(context.Background(), dedupe, server, mcpgate.WithLogger(quiet())); err != nil {
		t.Fatal(err)
	}
	ct, st := mcp.NewInMemoryTransports()
	if _, err := server.Connect(context.Background(), st, nil); err != nil {
		t.Fatal(err)
	}
	cs := connect(t, ct)
	wantReason(t, call(t, cs, "send", "k", nil), idemgate.ReasonOutcomeUnknown)
	e := wantReason(t, call(t, cs, "send", "k", nil), idemgate.ReasonOutcomeUnknown)
	if e["advice"] != "escalate" || runs != 1 {
		t.Fatalf("retry = %v after %d runs, want escalate after 1", e, runs)
	}
}

func TestKeyCarriers(t *testing.T) {
	f := setup(t, embeddedDedupe(t))
	// The argument the schema marks as the key.
	withArg := map[string]any{"customer": "cust_17", "amount": 4200, "order_id": "order-4"}
	call(t, f.client, "charge", "", withArg)
	if res := call(t, f.client, "charge", "order-4", withArg); !replayed(res) {
		t.Fatalf("the same key in _meta and the argument = %+v, want the replay", res)
	}
	if res := call(t, f.client, "charge", "", withArg); !replayed(res) {
		t.Fatalf("the key argument again = %+v, want the replay", res)
	}
	wantReason(t, call(t, f.client, "charge", "other", withArg), idemgate.ReasonKeyConflict)
	wantReason(t, call(t, f.client, "charge", " padded", order), idemgate.ReasonKeyInvalid)
	if c := f.tools.charges.Load(); c != 1 {
		t.Fatalf("charges = %d, want 1", c)
	}
}

// Over streamable HTTP, SEP-3182's idempotencyKey parameter reaches the
// gate, and the capability is advertised.
func TestSEP3182OverStreamableHTTP(t *testing.T) {
	ts := &tools{}
	server := ts.newServer()
	if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet()), mcpgate.WithSingleTenant()); err != nil {
		t.Fatal(err)
	}
	url := httpServer(t, server, nil)
	post := func(session string, body string) (*http.Response, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp, out
	}
	resp, init := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	session := resp.Header.Get("Mcp-Session-Id")
	caps, _ := init["result"].(map[string]any)["capabilities"].(map[string]any)
	toolsCap, _ := caps["tools"].(map[string]any)
	exp, _ := caps["experimental"].(map[string]any)
	if _, ok := toolsCap["idempotency"]; !ok || exp[mcpgate.CapabilityName] == nil {
		t.Fatalf("capabilities = %v, want tools.idempotency and experimental[%s]", caps, mcpgate.CapabilityName)
	}
	post(session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	var results []map[string]any
	for i := range 2 {
		_, out := post(session, `{"jsonrpc":"2.0","id":`+string(rune('2'+i))+`,"method":"tools/call","params":{"name":"charge","arguments":{"customer":"c","amount":1},"idempotencyKey":"sep-1"}}`)
		res, _ := out["result"].(map[string]any)
		if res == nil {
			t.Fatalf("tools/call = %v", out)
		}
		results = append(results, res)
	}
	if ts.charges.Load() != 1 || results[1]["_meta"].(map[string]any)[mcpgate.MetaReplayed] != true {
		t.Fatalf("charges %d, results %v: want one charge and the replay", ts.charges.Load(), results)
	}
}

// The tenant is the MCP session's authenticated user: one key used by two
// users is two actions; the same user again gets the replay.
func TestTenantFromTheSessionsToken(t *testing.T) {
	ts := &tools{}
	server := ts.newServer()
	if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet())); err != nil {
		t.Fatal(err)
	}
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: token, Expiration: time.Now().Add(time.Hour)}, nil
	}
	url := httpServer(t, server, func(h http.Handler) http.Handler { return auth.RequireBearerToken(verify, nil)(h) })
	clientFor := func(user string) *mcp.ClientSession {
		return connect(t, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{user}}})
	}
	alice, bob := clientFor("alice"), clientFor("bob")
	a1 := call(t, alice, "charge", "k", order)
	b1 := call(t, bob, "charge", "k", order)
	a2 := call(t, clientFor("alice"), "charge", "k", order)
	if ts.charges.Load() != 2 || replayed(b1) || !replayed(a2) || structured(t, a1)["charge_id"] != structured(t, a2)["charge_id"] {
		t.Fatalf("charges %d; bob %v, alice again %v: want two charges and alice's replay", ts.charges.Load(), b1.Meta, a2.Meta)
	}
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// Through the real Dedupe service over gRPC, on PostgreSQL.
func TestThroughTheDedupeServiceOverGRPC(t *testing.T) {
	f := setup(t, grpcDedupe(t), mcpgate.WithTool("charge", mcpgate.ToolPolicy{OnLostOutcome: idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED}))
	first := call(t, f.client, "charge", "order-9", order)
	second := call(t, f.client, "charge", "order-9", order)
	if f.tools.charges.Load() != 1 || !replayed(second) || !bytes.Equal(mustJSON(t, first.StructuredContent), mustJSON(t, second.StructuredContent)) {
		t.Fatalf("charges %d, second %+v: want one charge and its replay", f.tools.charges.Load(), second)
	}
	wantReason(t, call(t, f.client, "charge", "order-9", map[string]any{"customer": "x", "amount": 1}), idemgate.ReasonKeyReused)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

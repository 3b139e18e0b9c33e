package mcpgate_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/mcpgate"
)

// listedSchema is a listed tool's input schema: its properties and required
// names.
type listedSchema struct {
	Properties map[string]map[string]any `json:"properties"`
	Required   []string                  `json:"required"`
}

func listTools(t *testing.T, s *mcp.ClientSession) map[string]*mcp.Tool {
	t.Helper()
	res, err := s.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*mcp.Tool{}
	for _, tool := range res.Tools {
		out[tool.Name] = tool
	}
	return out
}

func schemaOf(t *testing.T, tool *mcp.Tool) listedSchema {
	t.Helper()
	b, err := json.Marshal(tool.InputSchema)
	if err != nil {
		t.Fatal(err)
	}
	var s listedSchema
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// A host that sends only the model's arguments (no _meta) gets a charge
// once per key through the added key argument, against the real Dedupe
// service on PostgreSQL: listed on gated tools only, required and marked;
// taken out before the typed tool (whose schema refuses unknown
// properties) runs; left out of the fingerprint; concurrent duplicates run
// once.
func TestAddedKeyArgumentGatesAStockHostsCall(t *testing.T) {
	f := setupTools(t, &tools{noKeyMark: true}, grpcDedupe(t), mcpgate.WithKeyArgument(mcpgate.DefaultKeyArgument))
	tools := listTools(t, f.client)
	for name, tool := range tools {
		s := schemaOf(t, tool)
		prop, listed := s.Properties["idempotency_key"]
		if gated := name != "balance"; listed != gated {
			t.Errorf("%s: key argument listed = %v, want %v", name, listed, gated)
			continue
		}
		if !listed {
			continue
		}
		if prop[mcpgate.SchemaKey] != true || prop["type"] != "string" || !strings.Contains(strings.Join(s.Required, ","), "idempotency_key") {
			t.Errorf("%s: key argument %v, required %v", name, prop, s.Required)
		}
		if !strings.Contains(tool.Description, "idempotency_key") {
			t.Errorf("%s: description %q does not name the argument", name, tool.Description)
		}
	}
	if _, ok := schemaOf(t, tools["charge"]).Properties["order_id"]; !ok {
		t.Error("the tool's own properties are gone from the listed schema")
	}

	args := func(key string) map[string]any {
		return map[string]any{"customer": "cust_host", "amount": 700, "idempotency_key": key}
	}
	first := call(t, f.client, "charge", "", args("order-1"))
	out := structured(t, first)
	if replayed(first) {
		t.Fatal("the first call is marked replayed")
	}
	var wg sync.WaitGroup
	results := make([]*mcp.CallToolResult, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = call(t, f.client, "charge", "", args("order-1"))
		}()
	}
	wg.Wait()
	for i, res := range results {
		if got := structured(t, res); !replayed(res) || got["charge_id"] != out["charge_id"] {
			t.Errorf("duplicate %d: %v replayed=%v, want the replay of %v", i, got, replayed(res), out)
		}
	}
	if c := f.tools.charges.Load(); c != 1 {
		t.Fatalf("charges = %d after nine calls with one key, want 1", c)
	}
	// A new key is a new action with the same arguments: the key argument
	// is not in the fingerprint, so it is not KEY_REUSED either.
	if res := call(t, f.client, "charge", "", args("order-2")); replayed(res) || structured(t, res)["charge_id"] == out["charge_id"] {
		t.Errorf("a new key = %+v, want a new charge", res)
	}
	if c := f.tools.charges.Load(); c != 2 {
		t.Errorf("charges = %d, want 2", c)
	}
	e := wantReason(t, call(t, f.client, "charge", "", map[string]any{"customer": "cust_host", "amount": 700}), idemgate.ReasonKeyMissing)
	if msg, _ := e["message"].(string); !strings.Contains(msg, "idempotency_key") {
		t.Errorf("KEY_MISSING message %q does not name the key argument", msg)
	}
	wantReason(t, call(t, f.client, "charge", "", map[string]any{"customer": "cust_host", "amount": 700, "idempotency_key": 5}), idemgate.ReasonKeyInvalid)
	wantReason(t, call(t, f.client, "charge", "other", args("order-1")), idemgate.ReasonKeyConflict)
	if c := f.tools.charges.Load(); c != 2 {
		t.Errorf("charges = %d after refusals, want 2", c)
	}
}

// ToolPolicy.AddKeyArgument adds the argument to one tool; New refuses an
// argument the tool already has and a name a host cannot send.
func TestAddedKeyArgumentPerTool(t *testing.T) {
	f := setup(t, embeddedDedupe(t), mcpgate.WithTool("flaky", mcpgate.ToolPolicy{AddKeyArgument: "action_key"}))
	listed := listTools(t, f.client)
	if _, ok := schemaOf(t, listed["flaky"]).Properties["action_key"]; !ok {
		t.Error("flaky does not list its key argument")
	}
	if _, ok := schemaOf(t, listed["charge"]).Properties["action_key"]; ok {
		t.Error("charge lists a key argument it was not given")
	}
	call(t, f.client, "flaky", "", map[string]any{"action_key": "a-1"}) // card declined: released
	if res := call(t, f.client, "flaky", "", map[string]any{"action_key": "a-1"}); res.IsError || replayed(res) {
		t.Fatalf("flaky's second run = %+v", res)
	}
	if res := call(t, f.client, "flaky", "", map[string]any{"action_key": "a-1"}); !replayed(res) {
		t.Fatalf("flaky again = %+v, want the replay", res)
	}

	for _, c := range []struct {
		ownKey bool // charge marks order_id as its key argument
		opt    mcpgate.Option
		want   string
	}{
		{false, mcpgate.WithKeyArgument("customer"), "already has a property"},
		{false, mcpgate.WithKeyArgument("order_id"), "already has a property"},
		{false, mcpgate.WithTool("charge", mcpgate.ToolPolicy{AddKeyArgument: "two words"}), "key argument name"},
		// Two key arguments would invite the model to fill them differently.
		{true, mcpgate.WithTool("charge", mcpgate.ToolPolicy{AddKeyArgument: "k"}), "already has the key argument order_id"},
	} {
		_, err := mcpgate.New(context.Background(), embeddedDedupe(t), (&tools{noKeyMark: !c.ownKey}).newServer(), c.opt)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New: %v, want an error containing %q", err, c.want)
		}
	}
}

// headerOverride sets the key argument's x-mcp-header mirror to a value of
// its own on every tools/call, as a client or proxy that lies would.
type headerOverride struct{ value string }

func (h headerOverride) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Header.Get("Mcp-Method") == "tools/call" {
		r = r.Clone(r.Context())
		r.Header.Set("Mcp-Param-Idempotency-Key", h.value)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// Over stateless HTTP at 2026-07-28 the go-sdk client mirrors the added key
// argument into Mcp-Param-Idempotency-Key (it is listed with x-mcp-header),
// a call runs once per key; a header that names another key than the
// argument is IDEMPOTENCY_KEY_CONFLICT, since the SDK checks the mirror only
// for the schemas it registered and the argument is the gate's.
func TestAddedKeyArgumentOverHTTP(t *testing.T) {
	ts := &tools{noKeyMark: true}
	server := ts.newServer()
	if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet()), mcpgate.WithKeyArgument("idempotency_key"), mcpgate.WithSingleTenant()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mcpgate.HTTPHandler(server))
	t.Cleanup(srv.Close)
	args := map[string]any{"customer": "cust_h", "amount": 5, "idempotency_key": "order-h"}
	for _, version := range []string{"2026-07-28", "2025-11-25"} {
		cs := connectAt(t, srv.URL, version, http.DefaultTransport)
		listTools(t, cs)
		if res := call(t, cs, "charge", "", args); res.IsError || replayed(res) != (version != "2026-07-28") {
			t.Errorf("%s: %+v, want the run (2026-07-28, first) or its replay", version, res)
		}
	}
	liar := connectAt(t, srv.URL, "2026-07-28", headerOverride{"order-other"})
	listTools(t, liar)
	wantReason(t, call(t, liar, "charge", "", args), idemgate.ReasonKeyConflict)
	if c := ts.charges.Load(); c != 1 {
		t.Errorf("charges = %d, want 1", c)
	}
}

// WithKeyArgument leaves a tool that has a key argument of its own as it
// is: one key argument per tool, so the model never fills two differently.
func TestWithKeyArgumentSkipsToolsWithTheirOwn(t *testing.T) {
	f := setup(t, embeddedDedupe(t), mcpgate.WithKeyArgument(mcpgate.DefaultKeyArgument))
	listed := listTools(t, f.client)
	if _, ok := schemaOf(t, listed["charge"]).Properties["idempotency_key"]; ok {
		t.Error("charge, whose order_id is its key argument, was given a second one")
	}
	if _, ok := schemaOf(t, listed["flaky"]).Properties["idempotency_key"]; !ok {
		t.Error("flaky, without a key argument, was not given one")
	}
	res := call(t, f.client, "charge", "", map[string]any{"customer": "c", "amount": 1, "order_id": "order-17"})
	if res.IsError || replayed(res) {
		t.Fatalf("charge keyed by order_id: %+v", res)
	}
}

// A tool changed and added again under the same *mcp.Tool (the SDK keeps
// the pointer) is classified anew: a read-only tool re-added without the
// hint is gated from its next call.
func TestAToolReAddedUnderTheSamePointerIsResolvedAgain(t *testing.T) {
	server := mcp.NewServer(&mcp.Implementation{Name: "s", Version: "1"}, nil)
	var runs atomic.Int64
	tool := &mcp.Tool{Name: "refund", InputSchema: map[string]any{"type": "object"}, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}
	h := func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		runs.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
	}
	server.AddTool(tool, h)
	if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet())); err != nil {
		t.Fatal(err)
	}
	ct, st := mcp.NewInMemoryTransports()
	ss, err := server.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs := connect(t, ct)
	call(t, cs, "refund", "", map[string]any{}) // read-only: runs ungated
	tool.Annotations = &mcp.ToolAnnotations{}
	server.AddTool(tool, h)
	runs.Store(0)
	call(t, cs, "refund", "k1", map[string]any{})
	res := call(t, cs, "refund", "k1", map[string]any{})
	if runs.Load() != 1 || !replayed(res) {
		t.Errorf("runs = %d with one key, second replayed = %v: the gate kept the stale read-only classification", runs.Load(), replayed(res))
	}
	wantReason(t, call(t, cs, "refund", "", map[string]any{}), idemgate.ReasonKeyMissing)
}

// SEP-2243 sends a header value that looks like its base64 wrapper wrapped
// again; the gate compares the decoded value, so such a key is not a
// conflict, and a wrapped lie still is.
func TestAddedKeyArgumentHeaderIsDecoded(t *testing.T) {
	ts := &tools{noKeyMark: true}
	server := ts.newServer()
	if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet()), mcpgate.WithKeyArgument("idempotency_key"), mcpgate.WithSingleTenant()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mcpgate.HTTPHandler(server))
	t.Cleanup(srv.Close)
	cs := connectAt(t, srv.URL, "2026-07-28", http.DefaultTransport)
	listTools(t, cs)
	if res := call(t, cs, "charge", "", map[string]any{"customer": "c", "amount": 1, "idempotency_key": "=?base64?abc?="}); res.IsError {
		t.Errorf("a key in the wrapper's shape: refused %v", errInfo(res))
	}
	liar := connectAt(t, srv.URL, "2026-07-28", headerOverride{"=?base64?b3RoZXI=?="}) // "other"
	listTools(t, liar)
	wantReason(t, call(t, liar, "charge", "", map[string]any{"customer": "c", "amount": 1, "idempotency_key": "order-x"}), idemgate.ReasonKeyConflict)
}

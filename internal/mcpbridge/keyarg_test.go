package mcpbridge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"

	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/mcpwire"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/internal/testing/testsvc"
)

const receiptTool = "examples.payments.v1.PaymentsService.SendReceipt"

func withKeyArgument(name string, tools ...string) func(*mcpbridge.Config) {
	return func(c *mcpbridge.Config) { c.KeyArgument, c.KeyArgumentTools = name, tools }
}

// callArgs calls a tool with arguments only, as a stock host does: no _meta.
func callArgs(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any, meta mcp.Meta) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args, Meta: meta})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// A host that sends only the model's arguments gates a charge once per key
// through the added key argument: the schema lists it, required and marked;
// the tool server never sees it; a new key charges again.
func TestKeyArgumentGatesAStockHostsCall(t *testing.T) {
	cs, ledger := setup(t, 0, nil, withKeyArgument("idempotency_key"))
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		s, _ := json.Marshal(tool.InputSchema)
		var schema struct {
			Properties map[string]map[string]any `json:"properties"`
			Required   []string                  `json:"required"`
		}
		if err := json.Unmarshal(s, &schema); err != nil {
			t.Fatal(err)
		}
		prop, listed := schema.Properties["idempotency_key"]
		gated := tool.Name != "examples.payments.v1.PaymentsService.GetBalance"
		if listed != gated {
			t.Errorf("%s: key argument listed = %v, want %v (gated tools only)", tool.Name, listed, gated)
			continue
		}
		if !gated {
			continue
		}
		if prop[mcpwire.SchemaKeyMark] != true || prop["type"] != "string" || prop["x-mcp-header"] != mcpwire.KeyHeaderName {
			t.Errorf("%s: key argument schema = %v", tool.Name, prop)
		}
		if !strings.Contains(tool.Description, "idempotency_key") {
			t.Errorf("%s: the description does not name the key argument: %q", tool.Name, tool.Description)
		}
		found := false
		for _, r := range schema.Required {
			found = found || r == "idempotency_key"
		}
		if !found {
			t.Errorf("%s: key argument not required: %v", tool.Name, schema.Required)
		}
	}

	args := func(key string) map[string]any {
		return map[string]any{"customerId": "cust_host", "amountCents": 700, "idempotency_key": key}
	}
	first := callArgs(t, cs, chargeTool, args("order-1"), nil)
	second := callArgs(t, cs, chargeTool, args("order-1"), nil)
	if first.IsError || second.IsError {
		t.Fatalf("errors: %+v %+v", first, second)
	}
	if first.Meta[mcpbridge.MetaReplayed] != false || second.Meta[mcpbridge.MetaReplayed] != true {
		t.Errorf("replayed = %v, %v; want false, true", first.Meta[mcpbridge.MetaReplayed], second.Meta[mcpbridge.MetaReplayed])
	}
	if text(first) != text(second) {
		t.Errorf("replay %q differs from the first answer %q", text(second), text(first))
	}
	if c, _ := ledger.Executions("cust_host"); c != 1 {
		t.Fatalf("charges = %d after one key twice, want 1", c)
	}
	if res := callArgs(t, cs, chargeTool, args("order-2"), nil); res.IsError || res.Meta[mcpbridge.MetaReplayed] != false {
		t.Fatalf("a new key: %+v", res)
	}
	if c, _ := ledger.Executions("cust_host"); c != 2 {
		t.Errorf("charges = %d after a second key, want 2", c)
	}
	// The same key in _meta and the argument is one key.
	if res := callArgs(t, cs, chargeTool, args("order-2"), mcp.Meta{mcpbridge.MetaKey: "order-2"}); res.IsError || res.Meta[mcpbridge.MetaReplayed] != true {
		t.Errorf("the same key in both carriers: %+v", res)
	}
}

func TestKeyArgumentRefusals(t *testing.T) {
	cs, ledger := setup(t, 0, nil, withKeyArgument("idempotency_key"))
	cases := []struct {
		name   string
		args   map[string]any
		meta   mcp.Meta
		reason string
		advice string
		text   string
	}{
		{"missing", map[string]any{"customerId": "cust_r", "amountCents": 1}, nil, "IDEMPOTENCY_KEY_MISSING", "fix_request", "idempotency_key"},
		{"empty", map[string]any{"customerId": "cust_r", "amountCents": 1, "idempotency_key": ""}, nil, "IDEMPOTENCY_KEY_MISSING", "fix_request", "idempotency_key"},
		{"not a string", map[string]any{"customerId": "cust_r", "amountCents": 1, "idempotency_key": 7}, nil, "IDEMPOTENCY_KEY_INVALID", "fix_request", "idempotency_key"},
		{"not printable", map[string]any{"customerId": "cust_r", "amountCents": 1, "idempotency_key": "k\u00e9"}, nil, "IDEMPOTENCY_KEY_INVALID", "fix_request", "printable"},
		{"conflict", map[string]any{"customerId": "cust_r", "amountCents": 1, "idempotency_key": "a"}, mcp.Meta{mcpbridge.MetaKey: "b"}, "IDEMPOTENCY_KEY_CONFLICT", "fix_request", "idempotency_key"},
	}
	for _, c := range cases {
		res := callArgs(t, cs, chargeTool, c.args, c.meta)
		e := errMeta(res)
		if !res.IsError || e["reason"] != c.reason || e["advice"] != c.advice {
			t.Errorf("%s: %+v, want %s (%s)", c.name, e, c.reason, c.advice)
			continue
		}
		if !strings.Contains(text(res), c.text) {
			t.Errorf("%s: text %q does not mention %q", c.name, text(res), c.text)
		}
	}
	if c, _ := ledger.Executions("cust_r"); c != 0 {
		t.Errorf("charges = %d after refusals, want 0", c)
	}
}

// KeyArgumentTools narrows the tools that get the argument; a name that is
// not a gated tool, or a name no host can send, fails New.
func TestKeyArgumentConfiguration(t *testing.T) {
	cs, _ := setup(t, 0, nil, withKeyArgument("k", receiptTool))
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		s, _ := json.Marshal(tool.InputSchema)
		if has := strings.Contains(string(s), `"k":`); has != (tool.Name == receiptTool) {
			t.Errorf("%s: key argument listed = %v", tool.Name, has)
		}
	}
	// ChargeCard without the argument still takes _meta.
	if res := charge(t, cs, "m-1", "cust_n"); res.IsError {
		t.Errorf("charge with _meta: %+v", res)
	}

	files := paymentsFiles(t)
	for _, c := range []struct {
		cfg  mcpbridge.Config
		want string
	}{
		{mcpbridge.Config{KeyArgument: "idempotency_key", KeyArgumentTools: []string{"examples.payments.v1.PaymentsService.GetBalance"}}, "not gated tools"},
		{mcpbridge.Config{KeyArgument: "bad name"}, "key argument name"},
		{mcpbridge.Config{KeyArgument: "customerId"}, "already has a property"},
		{mcpbridge.Config{KeyArgumentTools: []string{chargeTool}}, "needs Config.KeyArgument"},
	} {
		c.cfg.Files = files
		if _, err := mcpbridge.Methods(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one containing %q", c.cfg, err, c.want)
		}
	}
}

func text(res *mcp.CallToolResult) string {
	if len(res.Content) == 0 {
		return ""
	}
	t, _ := res.Content[0].(*mcp.TextContent)
	if t == nil {
		return ""
	}
	return t.Text
}

func paymentsFiles(t *testing.T) *protoregistry.Files {
	t.Helper()
	files, err := mcpbridge.NewFiles(mcpbridge.FileSet(paymentsv1.File_examples_payments_v1_payments_proto).GetFile())
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// A stock host's model that repeats a call without any key: under the tool
// server's keyless window (keyless: KEYLESS_POLICY_FINGERPRINT; 2s on
// TestService.MutateKeyless) the bridge forwards it keyless and the repeat
// is the replay, marked key-derived, one execution.
func TestKeylessWindowThroughTheBridge(t *testing.T) {
	svc := &testsvc.Server{}
	stack := stacktest.StartEmbedded(t, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, svc) }, stacktest.Config{})
	files, err := mcpbridge.NewFiles(mcpbridge.FileSet(testingv1.File_idemgate_testing_v1_testing_proto).GetFile())
	if err != nil {
		t.Fatal(err)
	}
	server, err := mcpbridge.New(mcpbridge.Config{Conn: stack.Tool, Files: files})
	if err != nil {
		t.Fatal(err)
	}
	cs := connectInMemory(t, server)
	// The pair must fall inside the 2s window; on a starved machine it may
	// not, and then a fresh pair is tried (never a timing assertion).
	for attempt := range 5 {
		payload := fmt.Sprintf("keyless-%d", attempt)
		before := svc.Executions()
		start := time.Now()
		first := callArgs(t, cs, "idemgate.testing.v1.TestService.MutateKeyless", map[string]any{"payload": payload}, nil)
		second := callArgs(t, cs, "idemgate.testing.v1.TestService.MutateKeyless", map[string]any{"payload": payload}, nil)
		if first.IsError || second.IsError {
			t.Fatalf("keyless calls refused: %s / %s", text(first), text(second))
		}
		if first.Meta[mcpbridge.MetaKeyDerived] != true || first.Meta[mcpbridge.MetaReplayed] != false {
			t.Fatalf("first keyless call _meta = %v, want key-derived and not replayed", first.Meta)
		}
		if time.Since(start) >= 2*time.Second {
			continue // the window may have closed between the two
		}
		if second.Meta[mcpbridge.MetaKeyDerived] != true || second.Meta[mcpbridge.MetaReplayed] != true || text(second) != text(first) {
			t.Fatalf("the repeat _meta = %v, text %s; want the key-derived replay of %s", second.Meta, text(second), text(first))
		}
		if n := svc.Executions() - before; n != 1 {
			t.Fatalf("executions = %d for a call and its keyless repeat, want 1", n)
		}
		return
	}
	t.Fatal("no pair of calls fell inside the 2s window in five tries")
}

// Over stateless HTTP at both protocol versions the key argument works;
// at 2026-07-28 the go-sdk client mirrors it into Mcp-Param-Idempotency-Key
// (x-mcp-header), and a request whose header says another key is refused
// before the tool server sees it.
func TestKeyArgumentOverHTTPAtEachProtocolVersion(t *testing.T) {
	ledger := &payments.Ledger{}
	stack := stacktest.StartEmbedded(t, func(s *grpc.Server) {
		paymentsv1.RegisterPaymentsServiceServer(s, &payments.Server{Ledger: ledger})
	}, stacktest.Config{})
	server, err := mcpbridge.New(mcpbridge.Config{Conn: stack.Tool, Files: paymentsFiles(t), KeyArgument: "idempotency_key"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var headers []string // Mcp-Param-Idempotency-Key of each tools/call
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if bytes.Contains(body, []byte(`"tools/call"`)) {
			mu.Lock()
			headers = append(headers, r.Header.Get("Mcp-Param-"+mcpwire.KeyHeaderName))
			mu.Unlock()
		}
		mcpbridge.HTTPHandler(server, mcpwire.HTTPLimits{}).ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	for _, version := range []string{"2026-07-28", "2025-11-25"} {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(),
			&mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: version})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.ListTools(context.Background(), nil); err != nil { // the client mirrors only tools it has listed
			t.Fatal(err)
		}
		customer := "cust_" + version
		args := map[string]any{"customerId": customer, "amountCents": 300, "idempotency_key": "order-" + version}
		first, second := callArgs(t, cs, chargeTool, args, nil), callArgs(t, cs, chargeTool, args, nil)
		if first.IsError || replayed(first) || !replayed(second) || text(first) != text(second) {
			t.Errorf("%s: %s then %s (replayed %v): want a run and its replay", version, text(first), text(second), replayed(second))
		}
		if c, _ := ledger.Executions(customer); c != 1 {
			t.Errorf("%s: charges = %d, want 1", version, c)
		}
		_ = cs.Close()
		mu.Lock()
		got := headers
		headers = nil
		mu.Unlock()
		want := ""
		if version == "2026-07-28" {
			want = "order-" + version
		}
		if len(got) != 2 {
			t.Errorf("%s: saw %d tools/call requests, want 2", version, len(got))
		}
		for _, h := range got {
			if h != want {
				t.Errorf("%s: Mcp-Param-%s = %q, want %q", version, mcpwire.KeyHeaderName, h, want)
			}
		}
	}

	// A 2026-07-28 request whose header and argument disagree: refused by
	// the SDK (400, header mismatch); nothing is charged.
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + chargeTool + `","arguments":{"customerId":"cust_mismatch","amountCents":1,"idempotency_key":"a"},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", chargeTool)
	req.Header.Set("Mcp-Param-"+mcpwire.KeyHeaderName, "b")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !bytes.Contains(raw, []byte("-32020")) {
		t.Errorf("mismatched header: %d %s, want 400 with the header-mismatch error -32020", resp.StatusCode, raw)
	}
	if c, _ := ledger.Executions("cust_mismatch"); c != 0 {
		t.Errorf("charges = %d after a refused request, want 0", c)
	}
}

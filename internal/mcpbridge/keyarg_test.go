package mcpbridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/reflect/protoregistry"

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
		if prop[mcpwire.SchemaKeyMark] != true || prop["type"] != "string" || prop["x-mcp-header"] != mcpwire.KeyArgumentHeader {
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
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
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

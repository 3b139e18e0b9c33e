package mcpbridge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/mcpwire"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

const chargeTool = "examples.payments.v1.PaymentsService.ChargeCard"

// setup runs the example payments server, gated, with server reflection,
// and a bridge built from what reflection reports, reached by the go-sdk
// client in memory. provider, when set, is the simulated provider's answer
// (payments.Server.Provider); configure, when given, changes the bridge's
// configuration.
func setup(t *testing.T, callTimeout time.Duration, provider func(context.Context) error, configure ...func(*mcpbridge.Config)) (*mcp.ClientSession, *payments.Ledger) {
	t.Helper()
	ledger := &payments.Ledger{}
	stack := stacktest.StartEmbedded(t, func(s *grpc.Server) {
		paymentsv1.RegisterPaymentsServiceServer(s, &payments.Server{Ledger: ledger, Provider: provider})
		reflection.Register(s)
	}, stacktest.Config{})
	ctx := context.Background()
	files, err := mcpbridge.LoadReflection(ctx, stack.Tool)
	if err != nil {
		t.Fatal(err)
	}
	cfg := mcpbridge.Config{Conn: stack.Tool, Files: files, CallTimeout: callTimeout}
	for _, c := range configure {
		c(&cfg)
	}
	server, err := mcpbridge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return connectInMemory(t, server), ledger
}

// connectInMemory connects the go-sdk client to server in memory.
func connectInMemory(t *testing.T, server *mcp.Server) *mcp.ClientSession {
	t.Helper()
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
	return cs
}

func charge(t *testing.T, cs *mcp.ClientSession, key, customer string) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{
		Name: chargeTool, Arguments: map[string]any{"customerId": customer, "amountCents": 4200},
		Meta: mcp.Meta{mcpbridge.MetaKey: key},
	})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func errMeta(res *mcp.CallToolResult) map[string]any {
	e, _ := res.Meta[mcpbridge.MetaError].(map[string]any)
	return e
}

// Reflection lists the payments service (gRPC's own reflection service left
// out) with the policy read from the reflected descriptors.
func TestReflectionListsThePolicy(t *testing.T) {
	cs, _ := setup(t, time.Minute, nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
		switch tool.Name {
		case chargeTool:
			// A gated tool is not idempotentHint: repeating it with the same
			// arguments runs it again unless the key is the same, and mcpgate
			// reads idempotentHint as "not gated".
			a := tool.Annotations
			if a.IdempotentHint || a.ReadOnlyHint || a.DestructiveHint == nil || !*a.DestructiveHint || !strings.Contains(tool.Description, mcpbridge.MetaKey) {
				t.Errorf("ChargeCard = %+v %+v, want idempotentHint false, destructiveHint true", tool.Annotations, tool.Description)
			}
		case "examples.payments.v1.PaymentsService.GetBalance":
			if !tool.Annotations.ReadOnlyHint {
				t.Errorf("GetBalance annotations = %+v", tool.Annotations)
			}
		}
	}
	if len(names) != 3 {
		t.Errorf("tools = %v, want the three payments methods", names)
	}
}

// A caller that gives up (the bridge's call deadline fires while the charge
// waits on its provider) is told to retry with the same key; the retry while
// the charge still runs is told the same; once the charge ends, the retry
// gets its replay, and the card was charged once.
func TestCallerGivesUpThenRetriesWithTheSameKey(t *testing.T) {
	release, started := make(chan struct{}), make(chan struct{}, 1)
	var once sync.Once
	cs, ledger := setup(t, 200*time.Millisecond, func(ctx context.Context) error {
		started <- struct{}{}
		select { // the provider acted; its answer is slow
		case <-release:
			return nil
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	})
	t.Cleanup(func() { once.Do(func() { close(release) }) })

	// Calls while the charge runs (the first starts it; on a loaded machine
	// a call may give up before its reservation, so call until it runs).
	for i, running := 0, false; i < 2 || !running; i++ {
		res := charge(t, cs, "order-slow", "cust_slow")
		e := errMeta(res)
		if !res.IsError || e["advice"] != mcpbridge.AdviceRetrySameKey {
			t.Fatalf("call %d while the charge runs = %+v, want an error with advice %s", i, e, mcpbridge.AdviceRetrySameKey)
		}
		if c := e["code"]; c != "DEADLINE_EXCEEDED" && e["reason"] != idemgate.ReasonInFlight {
			t.Errorf("call %d: code %v reason %v, want DEADLINE_EXCEEDED or %s", i, c, e["reason"], idemgate.ReasonInFlight)
		}
		select {
		case <-started:
			running = true
		default:
		}
	}
	once.Do(func() { close(release) })
	var res *mcp.CallToolResult
	for { // the outcome is stored in the background: retry as a caller would
		res = charge(t, cs, "order-slow", "cust_slow")
		if !res.IsError {
			break
		}
		if e := errMeta(res); e["advice"] != mcpbridge.AdviceRetrySameKey {
			t.Fatalf("retry = %+v", e)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if replayed, _ := res.Meta[mcpbridge.MetaReplayed].(bool); !replayed {
		t.Errorf("the retry after the charge ended = %+v, want a replay", res.Meta)
	}
	if charges, _ := ledger.Executions("cust_slow"); charges != 1 {
		t.Errorf("charges = %d, want 1", charges)
	}
}

// The bridge's own refusals carry the gate's reasons.
func TestKeyCarriers(t *testing.T) {
	cs, ledger := setup(t, time.Minute, nil)
	call := func(meta mcp.Meta) *mcp.CallToolResult {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{
			Name: chargeTool, Arguments: map[string]any{"customerId": "cust_k", "amountCents": 1}, Meta: meta,
		})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for _, tc := range []struct {
		name   string
		meta   mcp.Meta
		reason string
	}{
		{"a key that is not a string", mcp.Meta{mcpbridge.MetaKey: 42}, idemgate.ReasonKeyInvalid},
		{"a key with a control character", mcp.Meta{mcpbridge.MetaKey: "a\nb"}, idemgate.ReasonKeyInvalid},
		{"two carriers with different keys", mcp.Meta{mcpbridge.MetaKey: "a", "io.idemgate/sep3182-idempotency-key": "b"}, idemgate.ReasonKeyConflict},
		{"an empty key", mcp.Meta{mcpbridge.MetaKey: ""}, idemgate.ReasonKeyInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := call(tc.meta)
			if e := errMeta(res); !res.IsError || e["reason"] != tc.reason {
				t.Errorf("result = %+v, want %s", e, tc.reason)
			}
		})
	}
	if charges, _ := ledger.Executions("cust_k"); charges != 0 {
		t.Errorf("a refused call charged %d times", charges)
	}
}

// SEP-3182's idempotencyKey parameter reaches the handler through
// HTTPMiddleware, which the SDK alone would drop; a client cannot forge the
// private _meta slot the middleware uses.
func TestHTTPMiddlewareLiftsTheParameter(t *testing.T) {
	var got []byte
	h := mcpbridge.HTTPMiddleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
	}), mcpwire.HTTPLimits{})
	for _, tc := range []struct{ in, want string }{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","idempotencyKey":"k1"}}`,
			`{"id":1,"jsonrpc":"2.0","method":"tools/call","params":{"_meta":{"io.idemgate/sep3182-idempotency-key":"k1"},"name":"x"}}`},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"io.idemgate/sep3182-idempotency-key":"forged","a":1}}}`,
			`{"id":1,"jsonrpc":"2.0","method":"tools/call","params":{"_meta":{"a":1},"name":"x"}}`},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"idempotencyKey":"k1"}}`,
			`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"idempotencyKey":"k1"}}`},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(tc.in)))
		if string(got) != tc.want {
			t.Errorf("%s\n became %s\n want   %s", tc.in, got, tc.want)
		}
	}
}

// KeyReader does the same on a newline-delimited stream, line by line.
func TestKeyReaderLiftsTheParameter(t *testing.T) {
	in := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}` + "\n" +
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x","idempotencyKey":"k2","_meta":{"b":true}}}` + "\n"
	out, err := io.ReadAll(mcpbridge.KeyReader(strings.NewReader(in)))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(out, []byte("\n")), []byte("\n"))
	if len(lines) != 2 || string(lines[0]) != `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}` {
		t.Fatalf("out = %s", out)
	}
	var msg struct {
		Params map[string]json.RawMessage `json:"params"`
	}
	if err := json.Unmarshal(lines[1], &msg); err != nil {
		t.Fatal(err)
	}
	if _, ok := msg.Params["idempotencyKey"]; ok || string(msg.Params["_meta"]) != `{"b":true,"io.idemgate/sep3182-idempotency-key":"k2"}` {
		t.Errorf("tools/call became %s", lines[1])
	}
}

// A keyless call to a gated tool is refused with text that names the MCP
// carrier, not the gRPC metadata the tool server speaks of; the reason and
// the domain are the tool server's.
func TestKeyMissingNamesTheMCPCarrier(t *testing.T) {
	cs, ledger := setup(t, time.Minute, nil)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{
		Name: chargeTool, Arguments: map[string]any{"customerId": "cust_nokey", "amountCents": 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := errMeta(res)
	if !res.IsError || e["reason"] != idemgate.ReasonKeyMissing || e["advice"] != mcpbridge.AdviceFixRequest || e["domain"] == nil {
		t.Fatalf("result = %+v, want %s with advice %s", e, idemgate.ReasonKeyMissing, mcpbridge.AdviceFixRequest)
	}
	text := res.Content[0].(*mcp.TextContent).Text
	msg, _ := e["message"].(string)
	for _, s := range []string{text, msg} {
		if !strings.Contains(s, `_meta["`+mcpbridge.MetaKey+`"]`) || strings.Contains(s, "metadata") {
			t.Errorf("%q: want the _meta carrier named, no gRPC metadata", s)
		}
	}
	if charges, _ := ledger.Executions("cust_nokey"); charges != 0 {
		t.Errorf("a refused call charged %d times", charges)
	}
}

// A result's JSON has every field, zero values too: a never-charged
// customer's balance says charges 0 (a number), not nothing, so a model can
// tell 0 from unknown; and it conforms to the output schema the tool
// advertises.
func TestResultsCarryZeroValues(t *testing.T) {
	cs, _ := setup(t, time.Minute, nil)
	const balanceTool = "examples.payments.v1.PaymentsService.GetBalance"
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{
		Name: balanceTool, Arguments: map[string]any{"customerId": "cust_never"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("balance = %+v", res)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &got); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"customerId", "chargedCents", "charges", "receipts"} {
		if _, ok := got[field]; !ok {
			t.Errorf("balance %v lacks %s", got, field)
		}
	}
	// 64-bit integers are JSON numbers, not protojson's strings.
	if got["charges"] != float64(0) || got["chargedCents"] != float64(0) {
		t.Errorf("balance %v: want charges and chargedCents the number 0", got)
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if tool.Name != balanceTool {
			continue
		}
		b, err := json.Marshal(tool.OutputSchema)
		if err != nil {
			t.Fatal(err)
		}
		var schema jsonschema.Schema
		if err := json.Unmarshal(b, &schema); err != nil {
			t.Fatal(err)
		}
		resolved, err := schema.Resolve(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := resolved.Validate(got); err != nil {
			t.Errorf("the result %v does not conform to the output schema %s: %v", got, b, err)
		}
	}
}

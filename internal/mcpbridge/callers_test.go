package mcpbridge_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/mcpwire"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/internal/testing/testsvc"
)

const (
	mutateTool  = "idemgate.testing.v1.TestService.Mutate"
	keylessTool = "idemgate.testing.v1.TestService.MutateKeyless"
)

// callers is one bridge over HTTP behind CallerAuth (as idemgate-mcp
// -caller-token-file serves it), in front of one gated tool server with the
// payments and test services: every caller reaches the tool server under
// the bridge's one identity, so at its gate they are one tenant.
type callers struct {
	url string
	// open is the same bridge over HTTP without CallerAuth (loopback
	// idemgate-mcp -listen without -caller-token-file): one caller.
	open   string
	ledger *payments.Ledger
	svc    *testsvc.Server
}

func setupCallers(t *testing.T) *callers {
	t.Helper()
	c := &callers{ledger: &payments.Ledger{}, svc: &testsvc.Server{}}
	stack := stacktest.StartEmbedded(t, func(s *grpc.Server) {
		paymentsv1.RegisterPaymentsServiceServer(s, &payments.Server{Ledger: c.ledger})
		testingv1.RegisterTestServiceServer(s, c.svc)
	}, stacktest.Config{})
	files, err := mcpbridge.NewFiles(mcpbridge.FileSet(paymentsv1.File_examples_payments_v1_payments_proto, testingv1.File_idemgate_testing_v1_testing_proto).GetFile())
	if err != nil {
		t.Fatal(err)
	}
	server, err := mcpbridge.New(mcpbridge.Config{Conn: stack.Tool, Files: files})
	if err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{"s3cret-a": "alice", "s3cret-b": "bob"}
	srv := httptest.NewServer(mcpbridge.CallerAuth(tokens, mcpbridge.HTTPHandler(server, mcpwire.HTTPLimits{})))
	t.Cleanup(srv.Close)
	c.url = srv.URL
	open := httptest.NewServer(mcpbridge.HTTPHandler(server, mcpwire.HTTPLimits{}))
	t.Cleanup(open.Close)
	c.open = open.URL
	return c
}

// bearerWire sends a caller's token and records the results on the wire.
type bearerWire struct {
	token string
	w     *wire
}

func (b bearerWire) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.w.RoundTrip(r)
}

// caller is one MCP client of the bridge with a token.
type caller struct {
	cs *mcp.ClientSession
	w  *wire
}

func (c *callers) connect(t *testing.T, token string) *caller {
	t.Helper()
	w := &wire{}
	url, transport := c.url, http.RoundTripper(bearerWire{token, w})
	if token == "" {
		url, transport = c.open, w
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1, HTTPClient: &http.Client{Transport: transport}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return &caller{cs: cs, w: w}
}

// call calls a tool and returns its result and the raw bytes of its content
// and structuredContent on the wire.
func (c *caller) call(t *testing.T, name string, args map[string]any, meta mcp.Meta) (*mcp.CallToolResult, string) {
	t.Helper()
	res := callArgs(t, c.cs, name, args, meta)
	return res, string(c.w.last(t, "content")) + string(c.w.last(t, "structuredContent"))
}

// Two callers of one bridge that send the same key, with the same
// arguments and with different ones, each run once for themselves: neither
// is answered with the other's stored result nor refused as the other's
// key, and each one's duplicate replays its own outcome, byte for byte.
func TestCallersOfOneBridgeHaveTheirOwnKeys(t *testing.T) {
	c := setupCallers(t)
	alice, bob := c.connect(t, "s3cret-a"), c.connect(t, "s3cret-b")
	cases := []struct {
		name            string
		key             string
		aliceCustomer   string
		bobCustomer     string
		aliceCents, bob int
	}{
		{"same arguments", "order-1", "cust_same", "cust_same", 4200, 4200},
		{"different arguments", "order-2", "cust_alice", "cust_bob", 4200, 999},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			meta := mcp.Meta{mcpbridge.MetaKey: tc.key}
			aliceArgs := map[string]any{"customerId": tc.aliceCustomer, "amountCents": tc.aliceCents}
			bobArgs := map[string]any{"customerId": tc.bobCustomer, "amountCents": tc.bob}
			before := c.ledger.Charges()
			a1, aliceWire := alice.call(t, chargeTool, aliceArgs, meta)
			b1, bobWire := bob.call(t, chargeTool, bobArgs, meta)
			if a1.IsError || replayed(a1) {
				t.Fatalf("alice's first call: %s, want a run", text(a1))
			}
			if b1.IsError || replayed(b1) {
				t.Fatalf("bob's first call with alice's key: %s (replayed %v), want a run of his own", text(b1), replayed(b1))
			}
			if aliceWire == bobWire {
				t.Fatalf("bob was answered with alice's result %s", bobWire)
			}
			a2, aliceAgain := alice.call(t, chargeTool, aliceArgs, meta)
			b2, bobAgain := bob.call(t, chargeTool, bobArgs, meta)
			if !replayed(a2) || aliceAgain != aliceWire {
				t.Errorf("alice's duplicate = %s (replayed %v), want her own result %s replayed", aliceAgain, replayed(a2), aliceWire)
			}
			if !replayed(b2) || bobAgain != bobWire {
				t.Errorf("bob's duplicate = %s (replayed %v), want his own result %s replayed", bobAgain, replayed(b2), bobWire)
			}
			if n := len(c.ledger.Charges()) - len(before); n != 2 {
				t.Errorf("charges = %d for two callers' keys, each sent twice; want 2", n)
			}
		})
	}
}

// A key in the request's idempotency_key field (AIP-155 request_id) is the
// caller's too: the same request_id from two callers runs twice, each
// replayed to its own caller, and the handler sees the caller's stored key.
func TestCallersOwnTheKeyField(t *testing.T) {
	c := setupCallers(t)
	alice, bob := c.connect(t, "s3cret-a"), c.connect(t, "s3cret-b")
	args := map[string]any{"payload": "p", "requestId": "req-1"}
	a1, aliceWire := alice.call(t, mutateTool, args, nil)
	b1, bobWire := bob.call(t, mutateTool, args, nil)
	if a1.IsError || b1.IsError || replayed(a1) || replayed(b1) {
		t.Fatalf("alice %s (replayed %v), bob %s (replayed %v): want a run each", text(a1), replayed(a1), text(b1), replayed(b1))
	}
	if !strings.Contains(aliceWire, `"key":"alice/req-1"`) || !strings.Contains(bobWire, `"key":"bob/req-1"`) {
		t.Errorf("the handler saw the keys %s and %s, want alice/req-1 and bob/req-1", aliceWire, bobWire)
	}
	if a2, again := alice.call(t, mutateTool, args, nil); !replayed(a2) || again != aliceWire {
		t.Errorf("alice's duplicate = %s, want %s replayed", again, aliceWire)
	}
	if n := c.svc.Executions(); n != 2 {
		t.Errorf("executions = %d, want 2", n)
	}
	// The field and _meta must agree, as at the gate.
	res, _ := alice.call(t, mutateTool, args, mcp.Meta{mcpbridge.MetaKey: "req-2"})
	if e := errMeta(res); !res.IsError || e["reason"] != idemgate.ReasonKeyConflict || e["advice"] != mcpbridge.AdviceFixRequest {
		t.Errorf("_meta and requestId with different keys: %+v", res)
	}
}

// A keyless call of an authenticated caller to a gated tool is refused
// before the tool server: under KEYLESS_POLICY_FINGERPRINT the tool server
// would deduplicate it on its arguments within the bridge's one tenant, so
// another caller's identical call would be answered with this one's result.
func TestCallersKeylessCallsAreRefused(t *testing.T) {
	c := setupCallers(t)
	alice, bob := c.connect(t, "s3cret-a"), c.connect(t, "s3cret-b")
	args := map[string]any{"payload": "same"}
	for name, who := range map[string]*caller{"alice": alice, "bob": bob} {
		res, _ := who.call(t, keylessTool, args, nil)
		e := errMeta(res)
		if !res.IsError || e["reason"] != idemgate.ReasonKeyMissing || e["advice"] != mcpbridge.AdviceFixRequest {
			t.Fatalf("%s's keyless call = %s %v, want %s with advice %s", name, text(res), res.Meta, idemgate.ReasonKeyMissing, mcpbridge.AdviceFixRequest)
		}
		for _, s := range []string{`_meta["` + mcpbridge.MetaKey + `"]`, "shared by several callers"} {
			if !strings.Contains(text(res), s) {
				t.Errorf("refusal text %q lacks %q", text(res), s)
			}
		}
	}
	if n := c.svc.Executions(); n != 0 {
		t.Errorf("executions = %d, want none", n)
	}
	// With a key the tool is served.
	if res, _ := alice.call(t, keylessTool, args, mcp.Meta{mcpbridge.MetaKey: "k"}); res.IsError || replayed(res) {
		t.Errorf("with a key: %s", text(res))
	}
}

// The stored key is "<caller>/<key>", so a caller's key may be at most 255
// bytes less its name and the slash: a longer one is refused, not cut; an
// empty key or one with an edge space is refused as the gate would.
func TestCallersKeyLimit(t *testing.T) {
	c := setupCallers(t)
	alice := c.connect(t, "s3cret-a")
	args := map[string]any{"payload": "limit"}
	longest := strings.Repeat("k", 255-len("alice/"))
	if res, out := alice.call(t, mutateTool, args, mcp.Meta{mcpbridge.MetaKey: longest}); res.IsError || !strings.Contains(out, `"key":"alice/`+longest+`"`) {
		t.Fatalf("a key of %d bytes: %s", len(longest), text(res))
	}
	for _, tc := range []struct{ name, key, want string }{
		{"one byte over", longest + "k", "is 250 bytes long; this bridge stores a caller's key as alice/<key>, so alice's keys may be at most 249 bytes"},
		{"empty", "", "is empty"},
		{"leading space", " k", "must not start or end with a space"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, _ := alice.call(t, mutateTool, args, mcp.Meta{mcpbridge.MetaKey: tc.key})
			e := errMeta(res)
			if !res.IsError || e["reason"] != idemgate.ReasonKeyInvalid || e["advice"] != mcpbridge.AdviceFixRequest || !strings.Contains(text(res), tc.want) {
				t.Errorf("key %q = %s %v, want %s (%s) saying %q", tc.key, text(res), res.Meta, idemgate.ReasonKeyInvalid, mcpbridge.AdviceFixRequest, tc.want)
			}
		})
	}
	if n := c.svc.Executions(); n != 1 {
		t.Errorf("executions = %d, want only the longest key's", n)
	}
}

// Without CallerAuth the bridge has one caller, as before: its key is
// forwarded as sent, and a keyless call reaches the tool server's keyless
// window.
func TestOneCallerKeysAreForwardedAsSent(t *testing.T) {
	c := setupCallers(t)
	one := c.connect(t, "")
	if res, out := one.call(t, mutateTool, map[string]any{"payload": "p"}, mcp.Meta{mcpbridge.MetaKey: "order-1"}); res.IsError || !strings.Contains(out, `"key":"order-1"`) {
		t.Errorf("the tool server saw %s, want the key order-1 as sent", out)
	}
	if res, out := one.call(t, mutateTool, map[string]any{"payload": "p", "requestId": "req-1"}, nil); res.IsError || !strings.Contains(out, `"key":"req-1"`) {
		t.Errorf("the tool server saw %s, want the request_id req-1 as sent", out)
	}
	if res, _ := one.call(t, keylessTool, map[string]any{"payload": "p"}, nil); res.IsError || res.Meta[mcpbridge.MetaKeyDerived] != true {
		t.Errorf("keyless: %s %v, want the tool server's key-derived run", text(res), res.Meta)
	}
}

func TestCheckCallerName(t *testing.T) {
	for name, ok := range map[string]bool{
		"alice": true, "svc-1.prod_eu": true, strings.Repeat("n", mcpbridge.MaxCallerNameBytes): true,
		"": false, "alice/x": false, "b:ob": false, "a b": false, "caf\u00e9": false, strings.Repeat("n", mcpbridge.MaxCallerNameBytes+1): false,
	} {
		if err := mcpbridge.CheckCallerName(name); (err == nil) != ok {
			t.Errorf("CheckCallerName(%q) = %v, want ok %v", name, err, ok)
		}
	}
}

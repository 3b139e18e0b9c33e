package mcpgate_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/mcpgate"
)

// Arguments over WithMaxArgumentBytes are refused before they are parsed
// or fingerprinted, and nothing runs; the default is the SDK's HTTP body
// limit.
func TestArgumentsOverTheLimitAreRefused(t *testing.T) {
	if mcpgate.DefaultMaxArgumentBytes != 4<<20 {
		t.Errorf("DefaultMaxArgumentBytes = %d, want 4 MiB", mcpgate.DefaultMaxArgumentBytes)
	}
	f := setup(t, embeddedDedupe(t), mcpgate.WithMaxArgumentBytes(1024))
	big := map[string]any{"customer": "c", "amount": 1, "order_id": "k", "note": strings.Repeat("n", 2000)}
	e := wantReason(t, call(t, f.client, "charge", "", big), mcpgate.ReasonArgumentsTooLarge)
	if e["code"] != "INVALID_ARGUMENT" || f.tools.charges.Load() != 0 {
		t.Errorf("refusal %v after %d charges, want INVALID_ARGUMENT and none", e, f.tools.charges.Load())
	}
	if res := call(t, f.client, "charge", "k", order); res.IsError {
		t.Errorf("a call under the limit: %v", errInfo(res))
	}
}

// A call without a key to a tool that needs one is refused before its
// arguments are fingerprinted: arguments the fingerprint refuses (a lone
// surrogate) get IDEMPOTENCY_KEY_MISSING, not the fingerprint's error.
func TestAKeylessCallIsRefusedBeforeItsFingerprint(t *testing.T) {
	f := setup(t, embeddedDedupe(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := f.client.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: json.RawMessage(`{"customer":"\ud800x","amount":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	wantReason(t, res, idemgate.ReasonKeyMissing)
	res, err = f.client.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: json.RawMessage(`{"customer":"\ud800x","amount":1}`),
		Meta: mcp.Meta{mcpgate.MetaKey: "k"}})
	if err != nil {
		t.Fatal(err)
	}
	wantReason(t, res, mcpgate.ReasonArgumentsInvalid)
}

// Over HTTP, a gated call without an authenticated identity (no token, or
// a token that names no user) is refused UNAUTHENTICATED: callers without
// one would share one tenant, and one would be replayed another's result.
// Ungated tools still answer. Over stdio (and in memory) the one client is
// the one tenant.
func TestHTTPCallersWithoutAnIdentityAreRefused(t *testing.T) {
	ts := &tools{}
	server := ts.newServer()
	if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet())); err != nil {
		t.Fatal(err)
	}
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: strings.TrimPrefix(token, "nobody"), Expiration: time.Now().Add(time.Hour)}, nil
	}
	open := httptest.NewServer(mcpgate.HTTPHandler(server))
	t.Cleanup(open.Close)
	authed := httptest.NewServer(auth.RequireBearerToken(verify, nil)(mcpgate.HTTPHandler(server)))
	t.Cleanup(authed.Close)
	for _, c := range []struct {
		name string
		cs   *mcp.ClientSession
	}{
		{"no token", connectAt(t, open.URL, versions[0], nil)},
		{"no token, initialize", connectAt(t, open.URL, versions[1], nil)},
		{"a token without a user", connectAt(t, authed.URL, versions[0], bearer{"nobody"})},
	} {
		e := wantReason(t, call(t, c.cs, "charge", "k", order), mcpgate.ReasonUnauthenticated)
		if e["code"] != "UNAUTHENTICATED" {
			t.Errorf("%s: refusal %v, want UNAUTHENTICATED", c.name, e)
		}
		if res := call(t, c.cs, "balance", "", nil); res.IsError {
			t.Errorf("%s: the read-only tool: %+v", c.name, res)
		}
	}
	if c := ts.charges.Load(); c != 0 {
		t.Fatalf("charges = %d, want none", c)
	}
	if res := call(t, connectAt(t, authed.URL, versions[0], bearer{"alice"}), "charge", "k", order); res.IsError {
		t.Fatalf("alice: %v", errInfo(res))
	}
}

// WithSingleTenant says the server has one tenant: HTTP callers without
// an identity share it, and see one another's outcomes.
func TestWithSingleTenant(t *testing.T) {
	ts := &tools{}
	server := ts.newServer()
	if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet()), mcpgate.WithSingleTenant()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mcpgate.HTTPHandler(server))
	t.Cleanup(srv.Close)
	first := call(t, connectAt(t, srv.URL, versions[0], nil), "charge", "k", order)
	second := call(t, connectAt(t, srv.URL, versions[1], nil), "charge", "k", order)
	if first.IsError || !replayed(second) || ts.charges.Load() != 1 {
		t.Fatalf("first %v, second %v, charges %d: want one charge and its replay", errInfo(first), second.Meta, ts.charges.Load())
	}
}

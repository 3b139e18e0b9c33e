package mcpgate_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/mcpgate"
)

// The protocol versions the go-sdk client is pinned to: the stateless
// revision, and the last one with initialize and sessions.
var versions = []string{"2026-07-28", "2025-11-25"}

// wire records the raw result of every tools/call response read over HTTP.
type wire struct {
	next    http.RoundTripper
	mu      sync.Mutex
	results []json.RawMessage
}

func (w *wire) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	next := w.next
	if next == nil {
		next = http.DefaultTransport
	}
	resp, err := next.RoundTrip(r)
	if err != nil || !bytes.Contains(body, []byte(`"tools/call"`)) {
		return resp, err
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		line := strings.TrimPrefix(sc.Text(), "data: ")
		var msg struct {
			Result json.RawMessage `json:"result"`
		}
		if json.Unmarshal([]byte(line), &msg) == nil && msg.Result != nil {
			w.mu.Lock()
			w.results = append(w.results, msg.Result)
			w.mu.Unlock()
		}
	}
	return resp, nil
}

// last returns the raw result of the last tools/call response.
func (w *wire) last(t *testing.T) json.RawMessage {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.results) == 0 {
		t.Fatal("no tools/call result on the wire")
	}
	return w.results[len(w.results)-1]
}

// wantResultType fails unless every tools/call result on the wire carries
// resultType "complete" at 2026-07-28 (SEP-2322: a 2026-07-28 client refuses
// a result without it) and none at an earlier version, whichever version's
// call stored the outcome replayed; and the SDK's serverInfo in _meta at
// 2026-07-28 only.
func (w *wire) wantResultType(t *testing.T, version string) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	modern := version >= "2026-07-28"
	for _, raw := range w.results {
		got := string(member(t, raw, "resultType"))
		if want := map[bool]string{true: `"complete"`, false: ""}[modern]; got != want {
			t.Errorf("at %s, a result has resultType %s, want %q: %s", version, got, want, raw)
		}
		var meta map[string]json.RawMessage
		_ = json.Unmarshal(member(t, raw, "_meta"), &meta)
		if _, ok := meta[mcp.MetaKeyServerInfo]; ok != modern {
			t.Errorf("at %s, a result's _meta has %s: %v, want %v: %s", version, mcp.MetaKeyServerInfo, ok, modern, raw)
		}
	}
}

// member returns a member of a raw result object, as its bytes.
func member(t *testing.T, raw json.RawMessage, name string) json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m[name]
}

// connectAt connects the go-sdk client over streamable HTTP to url, pinned
// to version, and checks the version negotiated and the capability the
// server advertised (server/discover at 2026-07-28, initialize before).
func connectAt(t *testing.T, url, version string, rt http.RoundTripper) *mcp.ClientSession {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1, HTTPClient: &http.Client{Transport: rt}},
		&mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect at %s: %v", version, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	init := cs.InitializeResult()
	if init.ProtocolVersion != version {
		t.Fatalf("negotiated %s, want %s", init.ProtocolVersion, version)
	}
	want := map[string]any{"metaKey": mcpgate.MetaKey, "param": mcpgate.ParamKey}
	if c := init.Capabilities; c == nil || !reflect.DeepEqual(c.Extensions[mcpgate.CapabilityName], want) || !reflect.DeepEqual(c.Experimental[mcpgate.CapabilityName], want) {
		t.Errorf("%s: capabilities = %+v, want %s in extensions and experimental", version, c, mcpgate.CapabilityName)
	}
	return cs
}

// Over stateless streamable HTTP (HTTPHandler), a go-sdk client at
// 2026-07-28 (server/discover, no session) and one pinned to 2025-11-25
// (initialize, then calls, each POST on its own temporary session) see the
// capability; a charge runs once per key, its replay has the same bytes of
// text and structuredContent and is marked replayed; a keyless call is
// refused IDEMPOTENCY_KEY_MISSING with text for the model and advice
// fix_request. A key used at one version is replayed at the other.
func TestStatelessHTTPAtEachProtocolVersion(t *testing.T) {
	ts := &tools{}
	server := ts.newServer()
	if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet()), mcpgate.WithSingleTenant()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mcpgate.HTTPHandler(server))
	t.Cleanup(srv.Close)
	texts := map[string]string{}
	for _, version := range versions {
		t.Run(version, func(t *testing.T) {
			w := &wire{}
			cs := connectAt(t, srv.URL, version, w)
			before := ts.charges.Load()
			args := map[string]any{"customer": "cust_" + version, "amount": 4200}
			first := call(t, cs, "charge", "order-"+version, args)
			firstRaw := w.last(t)
			second := call(t, cs, "charge", "order-"+version, args)
			secondRaw := w.last(t)
			if ts.charges.Load() != before+1 || replayed(first) || !replayed(second) {
				t.Fatalf("charges %d -> %d, replayed %v then %v: want one charge, then its replay", before, ts.charges.Load(), replayed(first), replayed(second))
			}
			if !bytes.Equal(member(t, firstRaw, "content"), member(t, secondRaw, "content")) ||
				!bytes.Equal(member(t, firstRaw, "structuredContent"), member(t, secondRaw, "structuredContent")) {
				t.Errorf("replay differs:\n%s\n%s", firstRaw, secondRaw)
			}
			texts[version] = first.Content[0].(*mcp.TextContent).Text

			res := call(t, cs, "charge", "", map[string]any{"customer": "cust_" + version, "amount": 1})
			e := wantReason(t, res, idemgate.ReasonKeyMissing)
			text := res.Content[0].(*mcp.TextContent).Text
			for _, want := range []string{"IDEMPOTENCY_KEY_MISSING", "needs an idempotency key", `_meta["` + mcpgate.MetaKey + `"]`, "(fix_request)"} {
				if !strings.Contains(text, want) {
					t.Errorf("refusal text %q lacks %q", text, want)
				}
			}
			if e["advice"] != "fix_request" || ts.charges.Load() != before+1 {
				t.Errorf("refusal %v after %d charges, want advice fix_request and no charge", e, ts.charges.Load()-before)
			}
			w.wantResultType(t, version)
		})
	}
	// Across versions: each client retries the other version's action and
	// gets its outcome.
	for i, version := range versions {
		other := versions[1-i]
		w := &wire{}
		cs := connectAt(t, srv.URL, version, w)
		before := ts.charges.Load()
		res := call(t, cs, "charge", "order-"+other, map[string]any{"customer": "cust_" + other, "amount": 4200})
		if !replayed(res) || ts.charges.Load() != before || res.Content[0].(*mcp.TextContent).Text != texts[other] {
			t.Errorf("at %s, the retry of the %s action = %+v, want the replay of %q", version, other, res, texts[other])
		}
		w.wantResultType(t, version)
	}
}

// A gated call does not depend on the temporary session it arrived on: a
// 2026-07-28 caller that gives up closes its request (and with it the
// session) while the tool runs; the tool is not cancelled, and a retry on a
// new connection gets the replay.
func TestStatelessCallerGivesUp(t *testing.T) {
	ts := &tools{hold: make(chan struct{}), started: make(chan struct{}, 1), ended: make(chan error, 1)}
	server := ts.newServer()
	if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet()), mcpgate.WithSingleTenant()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mcpgate.HTTPHandler(server))
	t.Cleanup(srv.Close)
	cs := connectAt(t, srv.URL, versions[0], nil)
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: order, Meta: mcp.Meta{mcpgate.MetaKey: "order-gave-up"}})
		gaveUp <- err
	}()
	<-ts.started
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller's call = %v, want it cancelled", err)
	}
	time.Sleep(50 * time.Millisecond) // the server sees the request end and closes its session
	close(ts.hold)
	if err := <-ts.ended; err != nil {
		t.Fatalf("the tool's context ended with %v: the caller's request or session reached it", err)
	}
	retry := connectAt(t, srv.URL, versions[0], nil)
	res := call(t, retry, "charge", "order-gave-up", order)
	for res.IsError {
		wantReason(t, res, idemgate.ReasonInFlight) // the outcome may still be on its way
		res = call(t, retry, "charge", "order-gave-up", order)
	}
	if !replayed(res) || ts.charges.Load() != 1 {
		t.Fatalf("retry = %+v after %d charges, want the replay of the one charge", res, ts.charges.Load())
	}
}

// TokenTenant reads the request's token, which a stateless request carries
// itself: at 2026-07-28, one key used by two users is two actions, and the
// same user again gets the replay.
func TestStatelessTenantFromTheRequestsToken(t *testing.T) {
	ts := &tools{}
	server := ts.newServer()
	if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet())); err != nil {
		t.Fatal(err)
	}
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: token, Expiration: time.Now().Add(time.Hour)}, nil
	}
	srv := httptest.NewServer(auth.RequireBearerToken(verify, nil)(mcpgate.HTTPHandler(server)))
	t.Cleanup(srv.Close)
	alice, bob := connectAt(t, srv.URL, versions[0], bearer{"alice"}), connectAt(t, srv.URL, versions[0], bearer{"bob"})
	a1 := call(t, alice, "charge", "k", order)
	b1 := call(t, bob, "charge", "k", order)
	a2 := call(t, alice, "charge", "k", order)
	if ts.charges.Load() != 2 || replayed(b1) || !replayed(a2) || structured(t, a1)["charge_id"] != structured(t, a2)["charge_id"] {
		t.Fatalf("charges %d; bob %v, alice again %v: want two charges and alice's replay", ts.charges.Load(), b1.Meta, a2.Meta)
	}
}

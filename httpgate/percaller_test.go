package httpgate_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/httpgate"
)

// perCallerFields are the per-caller response fields every gate knows
// (internal/replayfields), as a handler behind a CORS middleware and an
// auth layer sets them.
var perCallerFields = map[string]string{
	"Set-Cookie":                       "sess=alice; HttpOnly",
	"Set-Cookie2":                      "old=alice",
	"Authorization-Info":               `nextnonce="alice-nonce"`,
	"Proxy-Authentication-Info":        `nextnonce="alice-proxy"`,
	"Access-Control-Allow-Origin":      "https://alice.example",
	"Access-Control-Allow-Credentials": "true",
	"Access-Control-Expose-Headers":    "X-Caller",
}

// recordingDedupe is the real Dedupe service, the outcomes the gate stores
// kept for the test to read; rewrite, when set, changes an outcome before
// it is stored (as an older gate would have written it).
type recordingDedupe struct {
	idemgatev1.DedupeServiceClient
	mu       sync.Mutex
	outcomes []*anypb.Any
	rewrite  func(*idemgatev1.HttpResponse)
}

func (d *recordingDedupe) Finish(ctx context.Context, in *idemgatev1.FinishRequest, opts ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	if d.rewrite != nil {
		resp := &idemgatev1.HttpResponse{}
		if err := in.GetOutcome().UnmarshalTo(resp); err == nil {
			d.rewrite(resp)
			in = proto.Clone(in).(*idemgatev1.FinishRequest)
			in.Outcome, _ = anypb.New(resp)
		}
	}
	d.mu.Lock()
	d.outcomes = append(d.outcomes, in.GetOutcome())
	d.mu.Unlock()
	return d.DedupeServiceClient.Finish(ctx, in, opts...)
}

// storedNames are the header names of every outcome stored so far.
func (d *recordingDedupe) storedNames(t *testing.T) map[string]bool {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	names := map[string]bool{}
	for _, o := range d.outcomes {
		resp := &idemgatev1.HttpResponse{}
		if err := o.UnmarshalTo(resp); err != nil {
			t.Fatal(err)
		}
		for _, h := range resp.GetHeaders() {
			names[h.GetName()] = true
		}
	}
	if len(d.outcomes) == 0 {
		t.Fatal("no outcome was stored")
	}
	return names
}

// perCallerServer is a gated API whose POST /me answers with the
// per-caller fields, X-Caller naming who asked, and fields every caller
// shares.
func perCallerServer(t *testing.T, d idemgatev1.DedupeServiceClient, opts ...httpgate.Option) string {
	t.Helper()
	gate, err := httpgate.New(d, "test-api", append([]httpgate.Option{httpgate.WithLogger(quiet()), httpgate.WithReplayCache(0, 0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /me", func(w http.ResponseWriter, r *http.Request) {
		if err := r.Context().Err(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		for name, v := range perCallerFields {
			w.Header().Set(name, v)
		}
		w.Header().Set("X-Caller", r.Header.Get("X-User"))
		w.Header().Set("Cache-Control", "private, no-store")
		w.Header().Set("Vary", "Origin")
		w.Header().Set("X-Charge-Id", "ch_1")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ch_1"}`))
	})
	srv := httptest.NewServer(gate.Handler(mux))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestPerCallerFieldsAreNeverStoredNorReplayed: bob, with alice's key and
// body, gets alice's outcome but none of her cookies, CORS grant or auth
// info; they are not in the stored record either. Cache-Control and Vary
// describe the response for every cache and are replayed.
func TestPerCallerFieldsAreNeverStoredNorReplayed(t *testing.T) {
	d := &recordingDedupe{DedupeServiceClient: dedupe(t)}
	url := perCallerServer(t, d)
	alice := post(t, url+"/me", "k-1", `{}`, "X-User", "alice")
	if alice.status != http.StatusCreated {
		t.Fatalf("alice: %d %s", alice.status, alice.body)
	}
	for name, v := range perCallerFields {
		if got := alice.header.Get(name); got != v {
			t.Errorf("the first caller gets %s = %q, want %q", name, got, v)
		}
	}
	bob := post(t, url+"/me", "k-1", `{}`, "X-User", "bob")
	if bob.header.Get(httpgate.ReplayedHeader) != "true" || string(bob.body) != `{"id":"ch_1"}` {
		t.Fatalf("bob: %d %v %s", bob.status, bob.header, bob.body)
	}
	for name := range perCallerFields {
		if got := bob.header.Values(name); len(got) != 0 {
			t.Errorf("a replay carries %s: %q", name, got)
		}
	}
	for _, name := range []string{"Cache-Control", "Vary", "X-Charge-Id"} {
		if bob.header.Get(name) != alice.header.Get(name) {
			t.Errorf("%s: replay %q, first %q", name, bob.header.Get(name), alice.header.Get(name))
		}
	}
	stored := d.storedNames(t)
	for name := range perCallerFields {
		if stored[name] {
			t.Errorf("%s is in the stored record", name)
		}
	}
	// Not named, X-Caller is an ordinary field: stored and replayed.
	if bob.header.Get("X-Caller") != "alice" || !stored["X-Caller"] {
		t.Errorf("X-Caller without WithPerCallerHeaders: replayed %q, stored %v", bob.header.Get("X-Caller"), stored["X-Caller"])
	}
}

// TestWithPerCallerHeaders: a field the operator names is per-caller too.
func TestWithPerCallerHeaders(t *testing.T) {
	d := &recordingDedupe{DedupeServiceClient: dedupe(t)}
	url := perCallerServer(t, d, httpgate.WithPerCallerHeaders("x-caller"))
	alice := post(t, url+"/me", "k-1", `{}`, "X-User", "alice")
	if alice.header.Get("X-Caller") != "alice" {
		t.Fatalf("the first caller gets X-Caller %q", alice.header.Get("X-Caller"))
	}
	bob := post(t, url+"/me", "k-1", `{}`, "X-User", "bob")
	if bob.header.Get(httpgate.ReplayedHeader) != "true" {
		t.Fatalf("bob: %d %v", bob.status, bob.header)
	}
	if got := bob.header.Values("X-Caller"); len(got) != 0 {
		t.Errorf("a replay carries X-Caller %q", got)
	}
	if d.storedNames(t)["X-Caller"] {
		t.Error("X-Caller is in the stored record")
	}
}

// TestOldRecordReplaysWithoutPerCallerFields: a record an older gate wrote
// with per-caller fields in it (as stored bytes of that shape) still
// replays, without them.
func TestOldRecordReplaysWithoutPerCallerFields(t *testing.T) {
	d := &recordingDedupe{DedupeServiceClient: dedupe(t)}
	d.rewrite = func(resp *idemgatev1.HttpResponse) {
		resp.Headers = append(resp.Headers,
			&idemgatev1.HttpHeader{Name: "Set-Cookie", Values: [][]byte{[]byte("sess=alice")}},
			&idemgatev1.HttpHeader{Name: "Access-Control-Allow-Origin", Values: [][]byte{[]byte("https://alice.example")}},
			&idemgatev1.HttpHeader{Name: "X-Caller", Values: [][]byte{[]byte("alice")}})
	}
	url := perCallerServer(t, d, httpgate.WithPerCallerHeaders("X-Caller"))
	post(t, url+"/me", "k-1", `{}`, "X-User", "alice")
	if names := d.storedNames(t); !names["Set-Cookie"] || !names["X-Caller"] {
		t.Fatalf("the old-shape record was not stored: %v", names)
	}
	bob := post(t, url+"/me", "k-1", `{}`, "X-User", "bob")
	if bob.header.Get(httpgate.ReplayedHeader) != "true" || string(bob.body) != `{"id":"ch_1"}` || bob.header.Get("X-Charge-Id") != "ch_1" {
		t.Fatalf("bob: %d %v %s", bob.status, bob.header, bob.body)
	}
	for _, name := range []string{"Set-Cookie", "Access-Control-Allow-Origin", "X-Caller"} {
		if got := bob.header.Values(name); len(got) != 0 {
			t.Errorf("a replay of an old record carries %s: %q", name, got)
		}
	}
}

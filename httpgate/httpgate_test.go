package httpgate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/httpgate"
)

func TestOncePerKeyReplaysTheSameBytes(t *testing.T) {
	f := setup(t, dedupe(t))
	first := post(t, f.url+"/charges", `"order-1"`, chargeBody)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	if first.header.Get(httpgate.ReplayedHeader) != "" || first.header.Get(httpgate.ExpiresAtHeader) == "" {
		t.Fatalf("first answer's headers: %v", first.header)
	}
	if len(first.header.Values("Set-Cookie")) != 1 {
		t.Fatalf("the first caller gets its cookie: %v", first.header)
	}
	second := post(t, f.url+"/charges", `"order-1"`, chargeBody)
	if got := f.p.charges.Load(); got != 1 {
		t.Fatalf("charges = %d, want 1", got)
	}
	if second.status != first.status || !bytes.Equal(second.body, first.body) {
		t.Fatalf("replay = %d %q, want %d %q", second.status, second.body, first.status, first.body)
	}
	for _, name := range []string{"Content-Type", "X-Charge-Id", "Content-Length"} {
		if second.header.Get(name) != first.header.Get(name) {
			t.Errorf("%s: replay %q, first %q", name, second.header.Get(name), first.header.Get(name))
		}
	}
	if got := second.header.Values("X-Multi"); strings.Join(got, ",") != "a,b" {
		t.Errorf("X-Multi = %v, want [a b] in order", got)
	}
	if second.header.Get(httpgate.ReplayedHeader) != "true" || second.header.Get(httpgate.OriginalTimeHeader) == "" || second.header.Get(httpgate.ExpiresAtHeader) == "" {
		t.Fatalf("replay's headers: %v", second.header)
	}
	if _, err := time.Parse(time.RFC3339Nano, second.header.Get(httpgate.OriginalTimeHeader)); err != nil {
		t.Fatal(err)
	}
	if len(second.header.Values("Set-Cookie")) != 0 {
		t.Fatalf("a replay never carries the stored cookie: %v", second.header)
	}
	// A bare key is the same key as its quoted form.
	third := post(t, f.url+"/charges", `order-1`, chargeBody)
	if !bytes.Equal(third.body, first.body) || third.header.Get(httpgate.ReplayedHeader) != "true" {
		t.Fatalf("bare key: %d %s", third.status, third.body)
	}
	if got := f.p.charges.Load(); got != 1 {
		t.Fatalf("charges = %d, want 1", got)
	}
}

func TestJSONBodyReencodedIsTheSameRequest(t *testing.T) {
	f := setup(t, dedupe(t))
	first := post(t, f.url+"/charges", `"k"`, `{"customer":"cus_1","amount":500}`)
	again := post(t, f.url+"/charges", `"k"`, "{ \"amount\": 5.0e2,\n \"customer\": \"cus_\\u0031\" }")
	if again.header.Get(httpgate.ReplayedHeader) != "true" || !bytes.Equal(again.body, first.body) {
		t.Fatalf("re-encoded body: %d %s", again.status, again.body)
	}
	// Another value is another request.
	other := post(t, f.url+"/charges", `"k"`, `{"customer":"cus_1","amount":501}`)
	problem(t, other, http.StatusUnprocessableEntity, idemgate.ReasonKeyReused)
	if got := f.p.charges.Load(); got != 1 {
		t.Fatalf("charges = %d, want 1", got)
	}
}

func TestRefusalsAreProblemDetails(t *testing.T) {
	f := setup(t, dedupe(t))
	t.Run("missing key is 400", func(t *testing.T) {
		p := problem(t, post(t, f.url+"/charges", "", chargeBody), http.StatusBadRequest, idemgate.ReasonKeyMissing)
		if !strings.Contains(p.Detail, "Idempotency-Key") || p.RetryAfter != 0 {
			t.Fatalf("problem = %+v", p)
		}
		if p.Type != httpgate.DefaultProblemTypeBase+"idempotency-key-missing" {
			t.Fatalf("type = %q", p.Type)
		}
	})
	for name, hdr := range map[string][]string{
		"two fields":             {httpgate.KeyHeader, `"a"`, httpgate.KeyHeader, `"b"`},
		"unterminated sf-string": {httpgate.KeyHeader, `"abc`},
		"parameters":             {httpgate.KeyHeader, `"abc";p=1`},
		"two sf-strings":         {httpgate.KeyHeader, `"a", "b"`},
		"too long":               {httpgate.KeyHeader, strings.Repeat("k", 256)},
	} {
		t.Run(name+" is 400", func(t *testing.T) {
			problem(t, post(t, f.url+"/charges", "", chargeBody, hdr...), http.StatusBadRequest, idemgate.ReasonKeyInvalid)
		})
	}
	t.Run("reused key is 422", func(t *testing.T) {
		post(t, f.url+"/charges", `"reuse"`, chargeBody)
		problem(t, post(t, f.url+"/charges", `"reuse"`, `{"customer":"cus_2","amount":1}`), http.StatusUnprocessableEntity, idemgate.ReasonKeyReused)
	})
	t.Run("body over the limit is 413", func(t *testing.T) {
		big := `{"customer":"` + strings.Repeat("x", httpgate.DefaultMaxBodyBytes) + `","amount":1}`
		problem(t, post(t, f.url+"/charges", `"big"`, big), http.StatusRequestEntityTooLarge, httpgate.ReasonRequestTooLarge)
	})
	if got := f.p.charges.Load(); got != 1 {
		t.Fatalf("charges = %d, want 1 (only the reuse test's first)", got)
	}
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	f := setup(t, dedupe(t), httpgate.WithDefaultPolicy(httpgate.RoutePolicy{MaxWait: 30 * time.Second}))
	release := f.held()
	const n = 8
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i] = post(t, f.url+"/charges", `"concurrent"`, chargeBody) })
	}
	<-f.p.started
	release()
	wg.Wait()
	if got := f.p.charges.Load(); got != 1 {
		t.Fatalf("charges = %d, want 1", got)
	}
	var body []byte
	for i, res := range results {
		switch res.status {
		case http.StatusCreated:
			if body == nil {
				body = res.body
			}
			if !bytes.Equal(res.body, body) {
				t.Fatalf("response %d: %s, want %s", i, res.body, body)
			}
		case http.StatusConflict:
			// Waited past MaxWait on a starved machine: still not a second run.
			problem(t, res, http.StatusConflict, idemgate.ReasonInFlight)
		default:
			t.Fatalf("response %d: %d %s", i, res.status, res.body)
		}
	}
}

func TestInFlightDuplicateIs409WithRetryAfter(t *testing.T) {
	f := setup(t, dedupe(t), httpgate.WithDefaultPolicy(httpgate.RoutePolicy{MaxWait: time.Millisecond}),
		httpgate.WithInFlightRetryAfter(2*time.Second))
	release := f.held()
	done := make(chan result)
	go func() { done <- post(t, f.url+"/charges", `"busy"`, chargeBody) }()
	<-f.p.started
	dup := post(t, f.url+"/charges", `"busy"`, chargeBody)
	p := problem(t, dup, http.StatusConflict, idemgate.ReasonInFlight)
	if p.RetryAfter != 2 || dup.header.Get("Retry-After") != "2" {
		t.Fatalf("retry after: %+v, header %q", p, dup.header.Get("Retry-After"))
	}
	release()
	if first := <-done; first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	if got := f.p.charges.Load(); got != 1 {
		t.Fatalf("charges = %d, want 1", got)
	}
}

func TestCallerGivesUpAndItsRetryReplays(t *testing.T) {
	f := setup(t, dedupe(t), httpgate.WithDefaultPolicy(httpgate.RoutePolicy{MaxWait: 30 * time.Second}))
	release := f.held()
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error)
	go func() {
		_, err := do(t, ctx, http.MethodPost, f.url+"/charges", `"impatient"`, chargeBody)
		gaveUp <- err
	}()
	<-f.p.started
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the client's request ended with %v, want its cancellation", err)
	}
	release() // the handler completes: its context is not the caller's
	retry := post(t, f.url+"/charges", `"impatient"`, chargeBody)
	if retry.status != http.StatusCreated || retry.header.Get(httpgate.ReplayedHeader) != "true" {
		t.Fatalf("retry: %d %v %s", retry.status, retry.header, retry.body)
	}
	if got := f.p.charges.Load(); got != 1 {
		t.Fatalf("charges = %d, want 1", got)
	}
	if got := f.p.ctxErr.Load(); got != "<nil>" {
		t.Fatalf("the handler's context had ended (%v) although only its caller gave up", got)
	}
}

func TestDedupeDownIs503AndNothingRuns(t *testing.T) {
	f := setup(t, downDedupe(t), httpgate.WithStoreRetryAfter(3*time.Second), httpgate.WithDedupeTimeout(10*time.Second))
	res := post(t, f.url+"/charges", `"down"`, chargeBody)
	p := problem(t, res, http.StatusServiceUnavailable, idemgate.ReasonStoreUnavailable)
	if p.RetryAfter != 3 || res.header.Get("Retry-After") != "3" {
		t.Fatalf("retry after: %+v, header %q", p, res.header.Get("Retry-After"))
	}
	if f.runs.Load() != 0 {
		t.Fatalf("the handler ran %d times with the Dedupe service down", f.runs.Load())
	}
	if err := f.gate.CheckDedupe(context.Background()); err == nil {
		t.Fatal("CheckDedupe = nil with the Dedupe service down")
	}
}

func TestFinishAfterReplyReplays(t *testing.T) {
	f := setup(t, dedupe(t))
	first := post(t, f.url+"/later", `"after"`, chargeBody)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	// The outcome is stored right after the reply; a duplicate in between
	// waits for it (MaxWait 20s).
	second := post(t, f.url+"/later", `"after"`, chargeBody)
	if second.header.Get(httpgate.ReplayedHeader) != "true" || !bytes.Equal(second.body, first.body) {
		t.Fatalf("second: %d %v %s", second.status, second.header, second.body)
	}
	if got := f.p.charges.Load(); got != 1 {
		t.Fatalf("charges = %d, want 1", got)
	}
}

func TestKeylessRequestsCollapseWithinTheWindow(t *testing.T) {
	f := setup(t, dedupe(t))
	first := post(t, f.url+"/keyless", "", chargeBody)
	second := post(t, f.url+"/keyless", "", chargeBody)
	if first.status != http.StatusCreated || first.header.Get(httpgate.KeyDerivedHeader) != "true" {
		t.Fatalf("first: %d %v", first.status, first.header)
	}
	if second.header.Get(httpgate.ReplayedHeader) != "true" || second.header.Get(httpgate.KeyDerivedHeader) != "true" || !bytes.Equal(second.body, first.body) {
		t.Fatalf("second: %d %v %s", second.status, second.header, second.body)
	}
	post(t, f.url+"/keyless", "", `{"customer":"cus_1","amount":501}`)
	if got := f.p.charges.Load(); got != 2 {
		t.Fatalf("charges = %d, want 2 (one per distinct body)", got)
	}
}

func TestResponseVerdicts(t *testing.T) {
	f := setup(t, dedupe(t), httpgate.WithRoute("POST /flaky", httpgate.RoutePolicy{}))
	t.Run("5xx is released and the retry runs", func(t *testing.T) {
		if res := post(t, f.url+"/flaky", `"flaky"`, ""); res.status != http.StatusInternalServerError {
			t.Fatalf("first: %d %s", res.status, res.body)
		}
		res := post(t, f.url+"/flaky", `"flaky"`, "")
		if res.status != http.StatusOK || res.header.Get(httpgate.ReplayedHeader) != "" {
			t.Fatalf("retry: %d %v %s", res.status, res.header, res.body)
		}
		if again := post(t, f.url+"/flaky", `"flaky"`, ""); again.header.Get(httpgate.ReplayedHeader) != "true" {
			t.Fatalf("third: %d %v", again.status, again.header)
		}
	})
	t.Run("4xx is stored when the route replays client errors", func(t *testing.T) {
		first := post(t, f.url+"/declined", `"declined"`, "")
		second := post(t, f.url+"/declined", `"declined"`, "")
		if first.status != http.StatusPaymentRequired || second.status != http.StatusPaymentRequired || second.header.Get(httpgate.ReplayedHeader) != "true" {
			t.Fatalf("declined: %d then %d %v", first.status, second.status, second.header)
		}
	})
	t.Run("a response marked outcome-unknown fails closed", func(t *testing.T) {
		problem(t, post(t, f.url+"/unknown", `"unknown"`, ""), http.StatusConflict, idemgate.ReasonOutcomeUnknown)
		problem(t, post(t, f.url+"/unknown", `"unknown"`, ""), http.StatusConflict, idemgate.ReasonOutcomeUnknown)
	})
	if got := f.runs.Load(); got != 2+1+1 {
		t.Fatalf("runs = %d, want 4 (flaky twice, declined once, unknown once)", got)
	}
}

func TestReconcilerSettlesALostOutcome(t *testing.T) {
	var asked []string
	f := setup(t, dedupe(t), httpgate.WithRoute("POST /unknown", httpgate.RoutePolicy{
		Reconciler: func(_ context.Context, key string, r *http.Request, body []byte) (httpgate.Resolution, error) {
			asked = append(asked, key+" "+r.URL.Path)
			return httpgate.ResolvedResponse(http.StatusAccepted, http.Header{"X-Reconciled": {"yes"}}, []byte("settled\n")), nil
		},
	}))
	problem(t, post(t, f.url+"/unknown", `"lost"`, ""), http.StatusConflict, idemgate.ReasonOutcomeUnknown)
	res := post(t, f.url+"/unknown", `"lost"`, "")
	if res.status != http.StatusAccepted || string(res.body) != "settled\n" || res.header.Get("X-Reconciled") != "yes" || res.header.Get(httpgate.ReplayedHeader) != "true" {
		t.Fatalf("after the reconciler: %d %v %q", res.status, res.header, res.body)
	}
	if len(asked) != 1 || asked[0] != "lost /unknown" {
		t.Fatalf("reconciler asked %v", asked)
	}
}

func TestRoutesNotGatedPassThrough(t *testing.T) {
	f := setup(t, downDedupe(t), httpgate.WithRoute("POST /charges/exempt", httpgate.RoutePolicy{NotGated: true}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct{ method, path string }{{http.MethodGet, "/charges"}, {http.MethodPut, "/charges/ch_1"}} {
		res, err := do(t, ctx, c.method, f.url+c.path, "", "")
		if err != nil || res.status != http.StatusOK {
			t.Fatalf("%s %s: %v %d %s", c.method, c.path, err, res.status, res.body)
		}
	}
	// Exempt by pattern: passes through even with the Dedupe service down
	// (the mux answers 405, as PUT /charges/{id} matches the path; the gate
	// never asked).
	if res := post(t, f.url+"/charges/exempt", "", ""); res.status != http.StatusMethodNotAllowed {
		t.Fatalf("exempt route: %d %s", res.status, res.body)
	}
	if p, gated := f.gate.Policy(httptestRequest(http.MethodPost, "/charges")); !gated || p.Retention != httpgate.DefaultRetention {
		t.Fatalf("Policy(POST /charges) = %+v, %v", p, gated)
	}
	if _, gated := f.gate.Policy(httptestRequest(http.MethodDelete, "/charges/1")); gated {
		t.Fatal("DELETE is gated by default")
	}
}

func httptestRequest(method, path string) *http.Request {
	r, _ := http.NewRequest(method, "http://example.test"+path, nil)
	return r
}

func TestNewRefusesBadConfiguration(t *testing.T) {
	client := downDedupe(t)
	for name, opts := range map[string][]httpgate.Option{
		"invalid pattern":     {httpgate.WithRoute("POST", httpgate.RoutePolicy{})},
		"conflicting pattern": {httpgate.WithRoute("POST /a", httpgate.RoutePolicy{}), httpgate.WithRoute("POST /a", httpgate.RoutePolicy{})},
		"lease out of range":  {httpgate.WithRoute("POST /a", httpgate.RoutePolicy{Lease: time.Millisecond})},
		"keyless window":      {httpgate.WithDefaultPolicy(httpgate.RoutePolicy{KeylessFingerprint: true, KeylessWindow: 48 * time.Hour})},
	} {
		if _, err := httpgate.New(client, "api", opts...); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	if _, err := httpgate.New(client, "a|b"); err == nil {
		t.Error(`New accepted the API name "a|b"`)
	}
}

func TestMetricsCountRequests(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := setup(t, dedupe(t), httpgate.WithRegisterer(reg))
	post(t, f.url+"/charges", `"m"`, chargeBody)
	post(t, f.url+"/charges", `"m"`, chargeBody)
	post(t, f.url+"/charges", "", chargeBody)
	want := `
# HELP idemgate_httpgate_requests_total Gated HTTP requests by route pattern and outcome: executed (stored), released (not an outcome: a retry runs again), replayed, or the reason they were refused.
# TYPE idemgate_httpgate_requests_total counter
idemgate_httpgate_requests_total{outcome="executed",route="POST /charges"} 1
idemgate_httpgate_requests_total{outcome="key_missing",route="POST /charges"} 1
idemgate_httpgate_requests_total{outcome="replayed",route="POST /charges"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idemgate_httpgate_requests_total"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "idemgate_httpgate_stage_seconds"); err != nil || n == 0 {
		t.Fatalf("stage histograms: %d, %v", n, err)
	}
}

func TestReplayCacheAnswersWithoutTheService(t *testing.T) {
	f := setup(t, dedupe(t), httpgate.WithReplayCache(100, 1<<20))
	first := post(t, f.url+"/charges", `"cached"`, chargeBody)
	second := post(t, f.url+"/charges", `"cached"`, chargeBody)
	if !bytes.Equal(first.body, second.body) || second.header.Get(httpgate.ReplayedHeader) != "true" {
		t.Fatalf("cached replay: %d %v %s", second.status, second.header, second.body)
	}
	if hits := f.gate.Stats().ReplayCacheHits; hits != 1 {
		t.Fatalf("replay cache hits = %d, want 1", hits)
	}
}

// A status net/http cannot send is the handler's panic, a lost outcome: it
// is never stored, so no duplicate replays it (every replay would panic).
func TestAnUnsendableStatusIsNotStored(t *testing.T) {
	var runs atomic.Int64
	gate, err := httpgate.New(dedupe(t), "odd-api", httpgate.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /odd", func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(1000)
	})
	srv := httptest.NewUnstartedServer(gate.Handler(mux))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handler's panic
	srv.Start()
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if res, err := do(t, ctx, http.MethodPost, srv.URL+"/odd", `"odd-1"`, `{}`); err == nil {
		t.Fatalf("the first call answered %d %s, want the connection closed by the handler's panic", res.status, res.body)
	}
	res, err := do(t, ctx, http.MethodPost, srv.URL+"/odd", `"odd-1"`, `{}`)
	if err != nil {
		t.Fatalf("the duplicate: %v (a stored status 1000 replayed)", err)
	}
	if reason := problemReason(res); reason != idemgate.ReasonInFlight && reason != idemgate.ReasonOutcomeUnknown {
		t.Fatalf("the duplicate answered %d %s, want in flight or outcome unknown", res.status, res.body)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// problemReason is a problem's reason, or "" for another answer.
func problemReason(res result) string {
	var p struct {
		Reason string `json:"reason"`
	}
	if res.header.Get("Content-Type") != httpgate.ProblemContentType || json.Unmarshal(res.body, &p) != nil {
		return ""
	}
	return p.Reason
}

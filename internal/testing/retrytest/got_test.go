package retrytest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/httpgate"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// missing ends the test: a failure under CI=true (.ci/run installs every
// dependency), a skip elsewhere.
func missing(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// docsRow is what docs/gating.md's table of refusals says of a reason:
// whether its answer carries Retry-After ("no", "yes", "for a rate quota")
// and whether got (its defaults, POST retried) retries it.
type docsRow struct {
	retryAfter string
	retried    bool
}

// docsTable reads that table.
func docsTable(t *testing.T) map[string]docsRow {
	t.Helper()
	raw, err := os.ReadFile("../../../docs/gating.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| \\[`(IDEMPOTENCY_[A-Z_]+)`\\]\\(#[a-z-]+\\) \\| \\d{3} \\| ([^|]+) \\| (retried|not retried) \\|")
	rows := map[string]docsRow{}
	for _, m := range row.FindAllStringSubmatch(string(raw), -1) {
		rows[m[1]] = docsRow{retryAfter: strings.TrimSpace(m[2]), retried: m[3] == "retried"}
	}
	if len(rows) < 12 {
		t.Fatalf("docs/gating.md's table of refusals has %d rows with got's column, want every reason's", len(rows))
	}
	return rows
}

// refusingDedupe is a Dedupe service that refuses every Begin as the key
// says, for the refusals the real one gives only when misconfigured:
// rejected (a credential it refuses), quota (the records quota, no retry
// delay), rate (the rate quota, 1s) and mismatch (an outcome of another
// type).
type refusingDedupe struct{ idemgatev1.DedupeServiceClient }

func (d refusingDedupe) Begin(_ context.Context, req *idemgatev1.BeginRequest, _ ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	switch req.GetKey() {
	case "rejected":
		return nil, status.Error(codes.PermissionDenied, "this tool server may not use the dedupe service")
	case "quota":
		return nil, grpcerr.New(codes.ResourceExhausted, "DEDUPE_QUOTA_EXCEEDED", "the namespace holds 10 records, at its quota of 10",
			map[string]string{"quota": "records", "limit": "10"}, 0)
	case "rate":
		return nil, grpcerr.New(codes.ResourceExhausted, "DEDUPE_QUOTA_EXCEEDED", "over the Begin rate",
			map[string]string{"quota": "rate", "limit": "1"}, time.Second)
	case "mismatch":
		outcome, _ := anypb.New(wrapperspb.String("a gRPC method's response"))
		now := time.Now()
		return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_Completed_{Completed: &idemgatev1.BeginResponse_Completed{
			Outcome: outcome, CompletedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(time.Hour))}}}, nil
	}
	return nil, status.Error(codes.Unimplemented, "refusingDedupe: no refusal for key "+req.GetKey())
}

// counter counts the requests the server received per scenario (the
// X-Scenario header), and calls onAnswer with each answer's status.
type counter struct {
	mu       sync.Mutex
	n        map[string]int
	onAnswer func(scenario string, n, status int)
}

func (c *counter) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scenario := r.Header.Get("X-Scenario")
		c.mu.Lock()
		c.n[scenario]++
		n := c.n[scenario]
		c.mu.Unlock()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		if c.onAnswer != nil {
			c.onAnswer(scenario, n, sw.status)
		}
	})
}

func (c *counter) count(scenario string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[scenario]
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

// app is the gated API: POST /charges (201, held while hold is open for
// the key "held"), POST /unknown (a provider timeout: 502 marked outcome
// unknown), POST /big (8 KiB, over the stored limit); runs counts each
// key's handler runs.
type app struct {
	mu   sync.Mutex
	runs map[string]int
	hold chan struct{}
	// started is told when the held charge started.
	started chan struct{}
}

func (a *app) ran(r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.runs[r.URL.Path+" "+r.Header.Get(httpgate.KeyHeader)]++
}

func (a *app) mux() *http.ServeMux {
	mux := http.NewServeMux()
	charge := func(w http.ResponseWriter, r *http.Request) {
		a.ran(r)
		if r.Header.Get(httpgate.KeyHeader) == `"held"` {
			a.started <- struct{}{}
			<-a.hold
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ch_1","status":"succeeded"}`))
	}
	mux.HandleFunc("POST /charges", charge)
	mux.HandleFunc("POST /down/charges", charge)
	mux.HandleFunc("POST /fake/charges", charge)
	mux.HandleFunc("POST /unknown", func(w http.ResponseWriter, r *http.Request) {
		a.ran(r)
		httpgate.MarkOutcomeUnknown(w)
		http.Error(w, "the provider timed out mid-charge", http.StatusBadGateway)
	})
	mux.HandleFunc("POST /big", func(w http.ResponseWriter, r *http.Request) {
		a.ran(r)
		_, _ = w.Write(bytes.Repeat([]byte("x"), 8<<10))
	})
	return mux
}

const token = "Bearer retrytest"

func tenant(r *http.Request) (string, error) {
	if r.Header.Get("Authorization") != token {
		return "", errors.New("send Authorization: " + token)
	}
	return "caller", nil
}

// step is one request of got.mjs's plan; result is what got returned.
type step struct {
	Name    string            `json:"name"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
	Client  string            `json:"client"`
}

type result struct {
	Name       string `json:"name"`
	Status     int    `json:"status"`
	Reason     string `json:"reason"`
	RetryAfter string `json:"retryAfter"`
	Replayed   bool   `json:"replayed"`
	RetryCount int    `json:"retryCount"`
	Error      string `json:"error"`
}

// TestGotRetriesOnlyWhatTheDocsSay: got 14 with its default retry settings
// (POST added to its methods) sends each refusal's request to an
// httpgate-gated server on the real Dedupe service and PostgreSQL (and, for
// the refusals a misconfigured or unreachable Dedupe service gives, on one
// that refuses or is down), and the server counts what it received: a
// refusal docs/gating.md's table says got leaves alone reached it once, one
// it says got retries three times (got's limit of 2 retries). The refusals
// to escalate (IDEMPOTENCY_OUTCOME_UNKNOWN, IDEMPOTENCY_KEY_REUSED) are
// among the first; IDEMPOTENCY_OUTCOME_UNKNOWN was answered 500, which got
// retried twice. Then the client the docs show, which retries a 409 only
// when it carries Retry-After, retries IDEMPOTENCY_IN_FLIGHT until the
// first request finished and gets its response replayed, and still sends
// IDEMPOTENCY_OUTCOME_UNKNOWN once. No handler ran twice for a key.
func TestGotRetriesOnlyWhatTheDocsSay(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		missing(t, "node is not installed: install Node.js 20 or later")
	}
	dir, _ := filepath.Abs("node")
	// got 14, the pin the test was written against, and got 16, npm's
	// current release, which enforces its retry rules before it asks
	// calculateDelay (the docs' first advice did nothing there).
	for _, module := range []string{"got", "got16"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", module, "package.json")); err != nil {
			missing(t, module+" is not installed: run make npm-ci (npm ci in "+dir+")")
		}
		t.Run(module, func(t *testing.T) {
			t.Parallel()
			gotRetriesOnlyWhatTheDocsSay(t, node, dir, module)
		})
	}
}

// gotRetriesOnlyWhatTheDocsSay is TestGotRetriesOnlyWhatTheDocsSay with the
// got of module, on a server and store of its own.
func gotRetriesOnlyWhatTheDocsSay(t *testing.T, node, dir, module string) {
	docs := docsTable(t)

	pool, schema := pgtest.Schema(t)
	store := pgstore.New(pool, pgstore.WithChannel(schema), pgstore.WithoutNotify())
	dsrv := grpc.NewServer()
	idemgatev1.RegisterDedupeServiceServer(dsrv, dedupesvc.NewServer(store, dedupesvc.WithLogger(quiet()), dedupesvc.WithPollInterval(20*time.Millisecond)))
	live := idemgatev1.NewDedupeServiceClient(stacktest.Serve(t, dsrv, grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig)))
	downConn, err := grpc.NewClient(stacktest.FreeAddr(t), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = downConn.Close() })
	down := idemgatev1.NewDedupeServiceClient(downConn)

	a := &app{runs: map[string]int{}, hold: make(chan struct{}), started: make(chan struct{}, 1)}
	gate := func(client idemgatev1.DedupeServiceClient, opts ...httpgate.Option) http.Handler {
		g, err := httpgate.New(client, "retrytest", append([]httpgate.Option{httpgate.WithLogger(quiet()), httpgate.WithTenant(tenant),
			httpgate.WithDefaultPolicy(httpgate.RoutePolicy{MaxBodyBytes: 4 << 10}), httpgate.WithMaxOutcomeBytes(4 << 10)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = g.Close(ctx)
		})
		return g.Handler(a.mux())
	}
	released := sync.OnceFunc(func() { close(a.hold) })
	t.Cleanup(released)
	c := &counter{n: map[string]int{}, onAnswer: func(scenario string, n, status int) {
		// The documented client's first IN_FLIGHT answered: let the
		// original finish, so the client's retry gets its outcome.
		if scenario == "in-flight-documented" && n == 1 && status == http.StatusConflict {
			released()
		}
	}}
	top := http.NewServeMux()
	top.Handle("/down/", gate(down))
	top.Handle("/fake/", gate(refusingDedupe{down}))
	top.Handle("/", gate(live))
	srv := httptest.NewServer(c.wrap(top))
	t.Cleanup(srv.Close)

	send := func(path, key, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(httpgate.KeyHeader, key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res
	}
	// What the plan's refusals need first: a key used with another body, an
	// outcome too large to store, and a request still running.
	if res := send("/charges", `"reused"`, `{"amount":1}`); res.StatusCode != http.StatusCreated {
		t.Fatalf("first use of the reused key: %d", res.StatusCode)
	}
	if res := send("/big", `"big"`, `{}`); res.StatusCode != http.StatusOK {
		t.Fatalf("the big response's first answer: %d", res.StatusCode)
	}
	original := make(chan *http.Response, 1)
	go func() { original <- send("/charges", `"held"`, `{"amount":1}`) }()
	<-a.started

	headers := func(key string, more ...string) map[string]string {
		h := map[string]string{"Authorization": token, "Content-Type": "application/json"}
		if key != "" {
			h[httpgate.KeyHeader] = key
		}
		for i := 0; i+1 < len(more); i += 2 {
			h[more[i]] = more[i+1]
		}
		return h
	}
	type scenario struct {
		step
		reason string
	}
	scenarios := []scenario{
		{step{Name: "key-missing", URL: "/charges", Headers: headers(""), Body: `{"amount":1}`}, idemgate.ReasonKeyMissing},
		{step{Name: "key-invalid", URL: "/charges", Headers: headers(`"` + strings.Repeat("k", 300) + `"`), Body: `{"amount":1}`}, idemgate.ReasonKeyInvalid},
		{step{Name: "unauthenticated", URL: "/charges", Headers: headers(`"anon"`, "Authorization", "Bearer nobody"), Body: `{"amount":1}`}, httpgate.ReasonUnauthenticated},
		{step{Name: "request-too-large", URL: "/charges", Headers: headers(`"large"`), Body: `{"pad":"` + strings.Repeat("x", 5<<10) + `"}`}, httpgate.ReasonRequestTooLarge},
		{step{Name: "key-reused", URL: "/charges", Headers: headers(`"reused"`), Body: `{"amount":2}`}, idemgate.ReasonKeyReused},
		{step{Name: "outcome-unknown-first", URL: "/unknown", Headers: headers(`"lost"`), Body: `{}`}, idemgate.ReasonOutcomeUnknown},
		{step{Name: "outcome-unknown-again", URL: "/unknown", Headers: headers(`"lost"`), Body: `{}`}, idemgate.ReasonOutcomeUnknown},
		{step{Name: "result-too-large", URL: "/big", Headers: headers(`"big"`), Body: `{}`}, idemgate.ReasonResultTooLarge},
		{step{Name: "store-unavailable", URL: "/down/charges", Headers: headers(`"down"`), Body: `{}`}, idemgate.ReasonStoreUnavailable},
		{step{Name: "store-rejected", URL: "/fake/charges", Headers: headers(`"rejected"`), Body: `{}`}, idemgate.ReasonStoreRejected},
		{step{Name: "quota-records", URL: "/fake/charges", Headers: headers(`"quota"`), Body: `{}`}, idemgate.ReasonQuotaExceeded},
		{step{Name: "quota-rate", URL: "/fake/charges", Headers: headers(`"rate"`), Body: `{}`}, idemgate.ReasonQuotaExceeded},
		{step{Name: "outcome-type-mismatch", URL: "/fake/charges", Headers: headers(`"mismatch"`), Body: `{}`}, idemgate.ReasonOutcomeTypeMismatch},
		{step{Name: "in-flight-default", URL: "/charges", Headers: headers(`"held"`), Body: `{"amount":1}`}, idemgate.ReasonInFlight},
		// The client docs/gating.md shows.
		{step{Name: "outcome-unknown-documented", URL: "/unknown", Headers: headers(`"lost"`), Body: `{}`, Client: "documented"}, idemgate.ReasonOutcomeUnknown},
		{step{Name: "in-flight-documented", URL: "/charges", Headers: headers(`"held"`), Body: `{"amount":1}`, Client: "documented"}, ""},
	}
	plan := make([]step, len(scenarios))
	covered := map[string]bool{}
	for i := range scenarios {
		s := &scenarios[i]
		s.URL = srv.URL + s.URL
		s.Headers["X-Scenario"] = s.Name
		if s.Client == "" {
			s.Client = "default"
		}
		plan[i] = s.step
		covered[s.reason] = true
	}
	for reason := range docs {
		if !covered[reason] {
			t.Errorf("no scenario for %s, which the docs' table lists", reason)
		}
	}
	planFile := filepath.Join(t.TempDir(), "plan.json")
	raw, _ := json.Marshal(plan)
	if err := os.WriteFile(planFile, raw, 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "got.mjs"), planFile, module)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node got.mjs: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	var results []result
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil || len(results) != len(scenarios) {
		t.Fatalf("got.mjs printed %q (%v), want %d results", stdout.String(), err, len(scenarios))
	}

	for i, s := range scenarios {
		r := results[i]
		received := c.count(s.Name)
		t.Logf("%-27s %-10s %d %-34s Retry-After %-3q got's retries %d, server received %d",
			s.Name, s.Client, r.Status, r.Reason, r.RetryAfter, r.RetryCount, received)
		if r.Error != "" {
			t.Errorf("%s: got failed: %s", s.Name, r.Error)
			continue
		}
		if s.Name == "in-flight-documented" {
			// Retried with the same key after Retry-After, then the
			// original's response, replayed.
			if r.Status != http.StatusCreated || !r.Replayed || received < 2 || r.RetryCount != received-1 {
				t.Errorf("%s: %d replayed %v after %d requests, want IDEMPOTENCY_IN_FLIGHT retried until the replay", s.Name, r.Status, r.Replayed, received)
			}
			continue
		}
		if r.Reason != s.reason || r.Status != httpgate.StatusOf(s.reason) {
			t.Errorf("%s: %d %q, want %d %s", s.Name, r.Status, r.Reason, httpgate.StatusOf(s.reason), s.reason)
		}
		if ra := docs[s.reason].retryAfter; (r.RetryAfter != "") != (ra == "yes" || ra == "for a rate quota" && s.Name == "quota-rate") {
			t.Errorf("%s: Retry-After %q; docs/gating.md says %q", s.Name, r.RetryAfter, ra)
		}
		want := 1
		if s.Client == "default" && docs[s.reason].retried {
			want = 3 // got's default limit: 2 retries
		}
		if received != want || r.RetryCount != want-1 {
			t.Errorf("%s (%s): the server received %d requests (got retried %d times); docs/gating.md says got retried: %v, so %d",
				s.Name, s.reason, received, r.RetryCount, docs[s.reason].retried, want)
		}
	}

	if res := <-original; res.StatusCode != http.StatusCreated || res.Header.Get(httpgate.ReplayedHeader) != "" {
		t.Errorf("the held original: %d %v", res.StatusCode, res.Header)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for key, n := range a.runs {
		if n != 1 {
			t.Errorf("%s ran %d times, want once", key, n)
		}
	}
}

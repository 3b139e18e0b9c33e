package httpgate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/httpgate"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// dedupe is the real Dedupe service on a fresh PostgreSQL schema, served
// over loopback gRPC (under CI=true a missing PostgreSQL fails the test).
func dedupe(t *testing.T) idemgatev1.DedupeServiceClient {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	store := pgstore.New(pool, pgstore.WithChannel(schema), pgstore.WithoutNotify())
	srv := grpc.NewServer()
	idemgatev1.RegisterDedupeServiceServer(srv, dedupesvc.NewServer(store, dedupesvc.WithLogger(quiet()), dedupesvc.WithPollInterval(20*time.Millisecond)))
	conn := stacktest.Serve(t, srv, grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
	return idemgatev1.NewDedupeServiceClient(conn)
}

// downDedupe is a client of a Dedupe service address nothing listens on.
func downDedupe(t *testing.T) idemgatev1.DedupeServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(stacktest.FreeAddr(t), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return idemgatev1.NewDedupeServiceClient(conn)
}

type chargeIn struct {
	Customer string `json:"customer"`
	Amount   int    `json:"amount"`
}

// provider is the payments provider the handlers call: it honours its
// context, counts its charges, and can be held.
type provider struct {
	charges atomic.Int64
	// hold, when set, makes charge say so on started and wait for it (or
	// its context).
	hold    chan struct{}
	started chan struct{}
	// ctxErr is the context error charge saw when it went through.
	ctxErr atomic.Value
}

func (p *provider) charge(ctx context.Context, in chargeIn) (string, error) {
	if p.hold != nil {
		p.started <- struct{}{}
		select {
		case <-p.hold:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	p.ctxErr.Store(fmt.Sprint(ctx.Err()))
	n := p.charges.Add(1)
	return fmt.Sprintf("ch_%06d", n), nil
}

// fixture is a gated test API on an httptest server.
type fixture struct {
	url  string
	gate *httpgate.Gate
	p    *provider
	// runs counts the handler runs of every route.
	runs atomic.Int64
}

// api is the test API: POST /charges (201 with a JSON body, a custom
// header and a cookie), POST /flaky (500 on its first run), POST
// /declined (402), POST /unknown (502 marked outcome unknown), GET
// /charges and PUT /charges/{id} (not gated by default).
func (f *fixture) api() *http.ServeMux {
	mux := http.NewServeMux()
	charge := func(w http.ResponseWriter, r *http.Request) {
		f.runs.Add(1)
		var in chargeIn
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, "bad body: "+err.Error(), http.StatusBadRequest)
			return
		}
		id, err := f.p.charge(r.Context(), in)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				httpgate.MarkOutcomeUnknown(w)
			}
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Charge-Id", id)
		w.Header().Add("X-Multi", "a")
		w.Header().Add("X-Multi", "b")
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "s-" + id})
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q,"customer":%q,"amount":%d}`+"\n", id, in.Customer, in.Amount)
	}
	mux.HandleFunc("POST /charges", charge)
	mux.HandleFunc("POST /keyless", charge)
	mux.HandleFunc("POST /later", charge)
	mux.HandleFunc("POST /flaky", func(w http.ResponseWriter, r *http.Request) {
		if f.runs.Add(1) == 1 {
			http.Error(w, "try again", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("POST /declined", func(w http.ResponseWriter, r *http.Request) {
		f.runs.Add(1)
		http.Error(w, "card declined", http.StatusPaymentRequired)
	})
	mux.HandleFunc("POST /unknown", func(w http.ResponseWriter, r *http.Request) {
		f.runs.Add(1)
		httpgate.MarkOutcomeUnknown(w)
		http.Error(w, "the provider timed out", http.StatusGatewayTimeout)
	})
	mux.HandleFunc("GET /charges", func(w http.ResponseWriter, r *http.Request) {
		f.runs.Add(1)
		fmt.Fprintf(w, "%d\n", f.p.charges.Load())
	})
	mux.HandleFunc("PUT /charges/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.runs.Add(1)
		fmt.Fprintf(w, "put %s\n", r.PathValue("id"))
	})
	return mux
}

// defaultRoutes are the test API's route policies, before the test's own
// options (a later WithRoute of the same pattern conflicts: use another).
func defaultRoutes() []httpgate.Option {
	return []httpgate.Option{
		httpgate.WithRoute("POST /declined", httpgate.RoutePolicy{ReplayClientErrors: true}),
		httpgate.WithRoute("POST /keyless", httpgate.RoutePolicy{KeylessFingerprint: true}),
		httpgate.WithRoute("POST /later", httpgate.RoutePolicy{FinishAfterReply: true, MaxWait: 20 * time.Second}),
	}
}

func setup(t *testing.T, client idemgatev1.DedupeServiceClient, opts ...httpgate.Option) *fixture {
	t.Helper()
	f := &fixture{p: &provider{}}
	all := append([]httpgate.Option{httpgate.WithLogger(quiet())}, defaultRoutes()...)
	gate, err := httpgate.New(client, "test-api", append(all, opts...)...)
	if err != nil {
		t.Fatalf("httpgate.New: %v", err)
	}
	f.gate = gate
	srv := httptest.NewServer(gate.Handler(f.api()))
	// Cleanups run last first: the server stops, then the gate closes.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// held makes the provider wait for the returned release.
func (f *fixture) held() (release func()) {
	f.p.hold, f.p.started = make(chan struct{}), make(chan struct{}, 16)
	return func() { close(f.p.hold) }
}

// result is one response, its body read whole.
type result struct {
	status int
	header http.Header
	body   []byte
}

func do(t *testing.T, ctx context.Context, method, url, key, body string, hdr ...string) (result, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(httpgate.KeyHeader, key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{}, err
	}
	return result{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

func post(t *testing.T, url, key, body string, hdr ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := do(t, ctx, http.MethodPost, url, key, body, hdr...)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return res
}

// problem decodes a refusal, failing unless it is problem details with
// status and reason.
func problem(t *testing.T, res result, status int, reason string) httpgate.Problem {
	t.Helper()
	if res.status != status {
		t.Fatalf("status = %d, want %d; body %s", res.status, status, res.body)
	}
	if ct := res.header.Get("Content-Type"); ct != httpgate.ProblemContentType {
		t.Fatalf("Content-Type = %q, want %q", ct, httpgate.ProblemContentType)
	}
	var p httpgate.Problem
	if err := json.Unmarshal(res.body, &p); err != nil {
		t.Fatalf("problem body %s: %v", res.body, err)
	}
	if p.Status != status || p.Reason != reason || p.Title == "" || p.Detail == "" || p.Type == "" {
		t.Fatalf("problem = %+v, want status %d reason %s with a type, title and detail", p, status, reason)
	}
	if ra := res.header.Get("Retry-After"); ra != "" && ra != strconv.Itoa(p.RetryAfter) || ra == "" && p.RetryAfter != 0 {
		t.Fatalf("Retry-After %q but retry_after %d", ra, p.RetryAfter)
	}
	// A refusal a retry cannot settle carries no Retry-After, which generic
	// retriers would honour.
	if reason == idemgate.ReasonOutcomeUnknown && p.RetryAfter != 0 {
		t.Fatalf("%s with Retry-After %d", reason, p.RetryAfter)
	}
	return p
}

const chargeBody = `{"customer":"cus_1","amount":500}`

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
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

type document struct {
	OpenAPI string `yaml:"openapi"`
	Paths   map[string]map[string]struct {
		OperationID string `yaml:"operationId"`
		KeyRequired *bool  `yaml:"x-idempotency-key-required"`
		Parameters  []struct {
			Ref string `yaml:"$ref"`
		} `yaml:"parameters"`
		Responses map[string]struct {
			Description string         `yaml:"description"`
			Headers     map[string]any `yaml:"headers"`
			Content     map[string]any `yaml:"content"`
		} `yaml:"responses"`
	} `yaml:"paths"`
	Components struct {
		Parameters map[string]struct {
			Name     string `yaml:"name"`
			In       string `yaml:"in"`
			Required bool   `yaml:"required"`
		} `yaml:"parameters"`
	} `yaml:"components"`
}

// TestOpenAPIDeclaresTheRoutesAsGated holds openapi.yaml to the API: every
// operation it declares is routed, is gated exactly when it declares the
// Idempotency-Key header parameter (and x-idempotency-key-required), and a
// gated one declares the problem-details answers the gate can give.
func TestOpenAPIDeclaresTheRoutesAsGated(t *testing.T) {
	var doc document
	if err := yaml.Unmarshal(openAPI, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1") || len(doc.Paths) == 0 {
		t.Fatalf("openapi = %q with %d paths", doc.OpenAPI, len(doc.Paths))
	}
	key := doc.Components.Parameters["IdempotencyKey"]
	if key.Name != httpgate.KeyHeader || key.In != "header" || !key.Required {
		t.Fatalf("the IdempotencyKey parameter is %+v", key)
	}
	conn, err := grpc.NewClient(stacktest.FreeAddr(t), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	gate, err := newGate(idemgatev1.NewDedupeServiceClient(conn), httpgate.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	mux := newAPI(&provider{}).mux()
	operations := 0
	for path, methods := range doc.Paths {
		for method, op := range methods {
			operations++
			method = strings.ToUpper(method)
			r := httptest.NewRequest(method, strings.ReplaceAll(path, "{id}", "ch_000001"), nil)
			if _, pattern := mux.Handler(r); pattern != method+" "+path {
				t.Errorf("%s %s (%s) is routed to %q", method, path, op.OperationID, pattern)
			}
			declaresKey := false
			for _, p := range op.Parameters {
				declaresKey = declaresKey || p.Ref == "#/components/parameters/IdempotencyKey"
			}
			if op.KeyRequired == nil || *op.KeyRequired != declaresKey {
				t.Errorf("%s %s: x-idempotency-key-required %v but the key parameter declared %v", method, path, op.KeyRequired, declaresKey)
			}
			if _, gated := gate.Policy(r); gated != declaresKey {
				t.Errorf("%s %s: gated %v, but the document declares the key %v", method, path, gated, declaresKey)
			}
			if !declaresKey {
				continue
			}
			for _, status := range []int{400, 401, 409, 413, 422, 429, 500, 503, 507} {
				resp, ok := op.Responses[strconv.Itoa(status)]
				if _, problem := resp.Content[httpgate.ProblemContentType]; !ok || !problem {
					t.Errorf("%s %s does not declare the %d problem the gate answers", method, path, status)
				}
			}
		}
	}
	if operations != 3 {
		t.Fatalf("%d operations, want 3", operations)
	}
}

// TestOpenAPIDeclaresEveryRefusalAsTheDocsSay holds POST /charges' answers
// in openapi.yaml to the table of docs/gating.md "What an HTTP caller does
// with each refusal" (which httpgate's TestDocsTableIsTheCodesMapping holds
// to the gate): every reason is named in the description of its status,
// and Retry-After is declared exactly for the statuses whose refusals carry
// it; no reason is named under another status.
func TestOpenAPIDeclaresEveryRefusalAsTheDocsSay(t *testing.T) {
	var doc document
	if err := yaml.Unmarshal(openAPI, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	raw, err := os.ReadFile("../../docs/gating.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| \\[`(IDEMPOTENCY_[A-Z_]+)`\\]\\(#[a-z-]+\\) \\| (\\d{3}) \\| ([^|]+) \\|")
	rows := row.FindAllStringSubmatch(string(raw), -1)
	if len(rows) < 12 {
		t.Fatalf("%d rows in docs/gating.md's table of refusals, want every reason's", len(rows))
	}
	responses := doc.Paths["/charges"]["post"].Responses
	statusOf := map[string]string{}
	retryAfter := map[string]bool{}
	for _, r := range rows {
		reason, status := r[1], r[2]
		statusOf[reason] = status
		retryAfter[status] = retryAfter[status] || strings.TrimSpace(r[3]) != "no"
		if s, _ := strconv.Atoi(status); s != httpgate.StatusOf(reason) {
			t.Errorf("%s: the docs say %s, httpgate answers %d", reason, status, httpgate.StatusOf(reason))
		}
		if !strings.Contains(responses[status].Description, reason) {
			t.Errorf("POST /charges %s does not name %s: %q", status, reason, responses[status].Description)
		}
	}
	for status, resp := range responses {
		for _, reason := range regexp.MustCompile(`IDEMPOTENCY_[A-Z_]+`).FindAllString(resp.Description, -1) {
			if statusOf[reason] != status {
				t.Errorf("POST /charges %s names %s, which the docs answer %q", status, reason, statusOf[reason])
			}
		}
		if !slices.Contains(slices.Collect(maps.Values(statusOf)), status) {
			continue // the API's own answer (201, 402)
		}
		if _, declared := resp.Headers["Retry-After"]; declared != retryAfter[status] {
			t.Errorf("POST /charges %s declares Retry-After %v; the docs' refusals at %s carry it: %v", status, declared, status, retryAfter[status])
		}
	}
}

func dedupe(t *testing.T) idemgatev1.DedupeServiceClient {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	store := pgstore.New(pool, pgstore.WithChannel(schema), pgstore.WithoutNotify())
	srv := grpc.NewServer()
	idemgatev1.RegisterDedupeServiceServer(srv, dedupesvc.NewServer(store, dedupesvc.WithLogger(quiet()), dedupesvc.WithPollInterval(20*time.Millisecond)))
	return idemgatev1.NewDedupeServiceClient(stacktest.Serve(t, srv, grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig)))
}

var testTokens = map[string]string{"alice-secret": "alice", "bob-secret": "bob"}

// serve serves the API on a gate with testTokens' callers.
func serve(t *testing.T, p *provider) *httptest.Server {
	t.Helper()
	gate, err := newGate(dedupe(t), httpgate.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(newAPI(p).handler(gate, testTokens))
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	return srv
}

// call sends method url with token (none when "") and, for a body, key.
func call(t *testing.T, method, url, token, key, body string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(httpgate.KeyHeader, key)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestAChargeRunsOncePerKey(t *testing.T) {
	p := &provider{}
	srv := serve(t, p)
	charge := func(key, body string) (*http.Response, []byte) {
		t.Helper()
		return call(t, http.MethodPost, srv.URL+"/charges", "alice-secret", key, body)
	}
	first, body1 := charge(`"ord-1"`, `{"customer":"cus_1","amount":1999,"currency":"usd"}`)
	second, body2 := charge(`"ord-1"`, `{"currency":"usd","amount":1999,"customer":"cus_1"}`)
	if first.StatusCode != http.StatusCreated || second.StatusCode != http.StatusCreated || !bytes.Equal(body1, body2) || second.Header.Get(httpgate.ReplayedHeader) != "true" {
		t.Fatalf("first %d %s, second %d %v %s", first.StatusCode, body1, second.StatusCode, second.Header, body2)
	}
	if len(p.charges) != 1 {
		t.Fatalf("charges = %d, want 1", len(p.charges))
	}
	declined1, d1 := charge(`"ord-2"`, `{"customer":"cus_1","amount":500000,"currency":"usd"}`)
	declined2, d2 := charge(`"ord-2"`, `{"customer":"cus_1","amount":500000,"currency":"usd"}`)
	if declined1.StatusCode != http.StatusPaymentRequired || declined2.Header.Get(httpgate.ReplayedHeader) != "true" || !bytes.Equal(d1, d2) {
		t.Fatalf("declined: %d then %d %v", declined1.StatusCode, declined2.StatusCode, declined2.Header)
	}
	resp, served := call(t, http.MethodGet, srv.URL+"/openapi.yaml", "", "", "")
	if resp.StatusCode != http.StatusOK || !bytes.Equal(served, openAPI) {
		t.Fatal("/openapi.yaml is not the document, served without a token")
	}
}

// Each caller is its own tenant: bob sending alice's key and body gets a
// charge of his own, not hers replayed, and cannot read hers; a call
// without a valid token gets 401 problem+json and charges nothing.
func TestCallersAreTenants(t *testing.T) {
	p := &provider{}
	srv := serve(t, p)
	body := `{"customer":"cus_1","amount":1999,"currency":"usd"}`
	alice, aliceBody := call(t, http.MethodPost, srv.URL+"/charges", "alice-secret", `"ord-1"`, body)
	bob, bobBody := call(t, http.MethodPost, srv.URL+"/charges", "bob-secret", `"ord-1"`, body)
	if alice.StatusCode != http.StatusCreated || bob.StatusCode != http.StatusCreated || bob.Header.Get(httpgate.ReplayedHeader) == "true" || bytes.Equal(aliceBody, bobBody) {
		t.Fatalf("alice %d %s; bob with her key and body %d %v %s: want a charge of his own", alice.StatusCode, aliceBody, bob.StatusCode, bob.Header, bobBody)
	}
	if len(p.charges) != 2 {
		t.Fatalf("charges = %d, want 2", len(p.charges))
	}
	if resp, b := call(t, http.MethodGet, srv.URL+alice.Header.Get("Location"), "bob-secret", "", ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("bob reading alice's charge: %d %s, want 404", resp.StatusCode, b)
	}
	if resp, b := call(t, http.MethodGet, srv.URL+alice.Header.Get("Location"), "alice-secret", "", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("alice reading her charge: %d %s, want 200", resp.StatusCode, b)
	}
	for _, token := range []string{"", "wrong", "alice-secretx"} {
		for _, r := range []struct{ method, path, body string }{{http.MethodPost, "/charges", body}, {http.MethodGet, alice.Header.Get("Location"), ""}} {
			resp, b := call(t, r.method, srv.URL+r.path, token, `"ord-9"`, r.body)
			var pr httpgate.Problem
			if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Content-Type") != httpgate.ProblemContentType ||
				!strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") || json.Unmarshal(b, &pr) != nil || pr.Status != http.StatusUnauthorized {
				t.Errorf("%s %s with token %q: %d %v %s, want 401 problem+json", r.method, r.path, token, resp.StatusCode, resp.Header, b)
			}
		}
	}
	if len(p.charges) != 2 {
		t.Fatalf("charges = %d after unauthenticated calls, want 2", len(p.charges))
	}
}

// After a restart (a new provider on the same Dedupe store) a replay's
// Location still names the replayed charge: the new process's first charge
// does not get the id of the old process's first charge, so reading the
// replayed Location never shows another customer's charge.
func TestChargeIDsSurviveARestart(t *testing.T) {
	client := dedupe(t)
	serveOn := func(p *provider) *httptest.Server {
		gate, err := newGate(client, httpgate.WithLogger(quiet()))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(newAPI(p).handler(gate, testTokens))
		t.Cleanup(func() {
			srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = gate.Close(ctx)
		})
		return srv
	}
	before := serveOn(&provider{})
	first, _ := call(t, http.MethodPost, before.URL+"/charges", "alice-secret", `"ord-1"`, `{"customer":"cus_1","amount":1999,"currency":"usd"}`)
	if first.StatusCode != http.StatusCreated {
		t.Fatalf("first charge: %d", first.StatusCode)
	}
	before.Close()

	after := serveOn(&provider{}) // the restarted process: a new ledger
	other, _ := call(t, http.MethodPost, after.URL+"/charges", "alice-secret", `"ord-2"`, `{"customer":"cus_2","amount":5,"currency":"usd"}`)
	replay, _ := call(t, http.MethodPost, after.URL+"/charges", "alice-secret", `"ord-1"`, `{"customer":"cus_1","amount":1999,"currency":"usd"}`)
	if other.StatusCode != http.StatusCreated || replay.Header.Get(httpgate.ReplayedHeader) != "true" {
		t.Fatalf("after the restart: a new charge %d, the replay %d %v", other.StatusCode, replay.StatusCode, replay.Header)
	}
	if replay.Header.Get("Location") == other.Header.Get("Location") {
		t.Fatalf("the replayed charge's Location %s is the new process's charge of cus_2", replay.Header.Get("Location"))
	}
	resp, b := call(t, http.MethodGet, after.URL+replay.Header.Get("Location"), "alice-secret", "", "")
	if resp.StatusCode == http.StatusOK && strings.Contains(string(b), "cus_2") {
		t.Errorf("the replayed Location %s reads %s: another customer's charge", replay.Header.Get("Location"), b)
	}
}

// A duplicate sent while the original charge runs waits up to the route's
// MaxWait, then gets 409 IDEMPOTENCY_IN_FLIGHT with Retry-After; once the
// original ends, the same request is replayed. -charge-delay shows this
// by hand; here the charge is held until the 409 came.
func TestConcurrentDuplicateGets409(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	p := &provider{wait: func(ctx context.Context) error {
		close(started)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return ctx.Err()
	}}
	srv := serve(t, p)
	body := `{"customer":"cus_1","amount":1999,"currency":"usd"}`
	type answer struct {
		resp *http.Response
		body []byte
	}
	original := make(chan answer, 1)
	go func() {
		resp, b := call(t, http.MethodPost, srv.URL+"/charges", "alice-secret", `"ord-slow"`, body)
		original <- answer{resp, b}
	}()
	<-started
	dup, dupBody := call(t, http.MethodPost, srv.URL+"/charges", "alice-secret", `"ord-slow"`, body)
	close(release)
	var pr httpgate.Problem
	if dup.StatusCode != http.StatusConflict || dup.Header.Get("Retry-After") == "" || json.Unmarshal(dupBody, &pr) != nil || pr.Reason != "IDEMPOTENCY_IN_FLIGHT" {
		t.Errorf("the duplicate while the charge runs: %d %v %s, want 409 IDEMPOTENCY_IN_FLIGHT with Retry-After", dup.StatusCode, dup.Header, dupBody)
	}
	first := <-original
	again, againBody := call(t, http.MethodPost, srv.URL+"/charges", "alice-secret", `"ord-slow"`, body)
	if first.resp.StatusCode != http.StatusCreated || again.Header.Get(httpgate.ReplayedHeader) != "true" || !bytes.Equal(first.body, againBody) {
		t.Errorf("the original %d %s, the retry after it %d %v %s: want 201 and its replay", first.resp.StatusCode, first.body, again.StatusCode, again.Header, againBody)
	}
	if len(p.charges) != 1 {
		t.Errorf("%d charges, want 1", len(p.charges))
	}
}

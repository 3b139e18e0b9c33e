package console_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/console"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

const (
	adminToken  = "admin-secret-0123456789"
	clientToken = "client-secret-0123456789"
	// namespace is the tool server whose records the tests make.
	namespace = "tools"
	scope     = "/payments.v1.Payments/Charge|acme"
)

// logBuffer collects the console's log lines; handlers write from the
// server's goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// fixture is a Dedupe service on a fresh PostgreSQL schema with the console
// in front of its admin API.
type fixture struct {
	srv    *dedupesvc.Server
	admin  *dedupesvc.AdminServer
	authn  *auth.Authenticator
	server *httptest.Server
	logs   *logBuffer
	// console is the console server serves, for tests that drive its
	// sampler.
	console *console.Console
	// pool is the fixture's schema's pool, for tests that write rows
	// themselves.
	pool *pgxpool.Pool
}

// newFixture is a console over a Dedupe service of its own on a fresh
// schema; opts change the console's Config.
func newFixture(t *testing.T, opts ...func(*console.Config)) *fixture {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	store := pgstore.New(pool, pgstore.WithChannel(schema), pgstore.WithoutNotify())
	logs := &logBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, nil))
	srv := dedupesvc.NewServer(store, dedupesvc.WithLogger(logger))
	return consoleOver(t, store, srv, pool, logs, opts...)
}

// consoleOver serves a console over the admin API of srv and its store on
// pool, logging to logs: the Tenants page reads the store's usage, the
// overview checks pool's PostgreSQL.
func consoleOver(t *testing.T, store dedupesvc.Store, srv *dedupesvc.Server, pool *pgxpool.Pool, logs *logBuffer, opts ...func(*console.Config)) *fixture {
	t.Helper()
	logger := slog.New(slog.NewJSONHandler(logs, nil))
	admin, err := dedupesvc.NewAdminServer(store, srv)
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.New(auth.Config{Logger: logger, Tokens: []auth.Token{
		{Name: "oncall", Secret: adminToken, Admin: true}, {Name: namespace, Secret: clientToken}}})
	if err != nil {
		t.Fatal(err)
	}
	usage, _ := store.(dedupesvc.UsageLister)
	cfg := console.Config{Admin: admin, Authenticator: authn, Logger: logger, Usage: usage,
		Health: func(ctx context.Context) console.StoreHealth { return console.PostgresHealth(ctx, pool, false) }}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the server closes, then the console.
	t.Cleanup(c.Close)
	server := httptest.NewServer(c)
	t.Cleanup(server.Close)
	return &fixture{srv: srv, admin: admin, authn: authn, server: server, logs: logs, pool: pool, console: c}
}

func toolContext() context.Context {
	return dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: namespace})
}

// begin reserves key as the tool server would, returning the epoch.
func (f *fixture) begin(t *testing.T, key string) (*idemgatev1.BeginResponse, int64) {
	t.Helper()
	fp := sha256.Sum256([]byte(key))
	resp, err := f.srv.Begin(toolContext(), &idemgatev1.BeginRequest{Scope: scope, Key: key, Fingerprint: fp[:], AttemptToken: "attempt-" + key,
		Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatalf("Begin %s: %v", key, err)
	}
	return resp, resp.GetReserved().GetEpoch()
}

// completed makes a completed record of key.
func (f *fixture) completed(t *testing.T, key string) {
	t.Helper()
	_, epoch := f.begin(t, key)
	outcome, _ := anypb.New(wrapperspb.String("charged " + key))
	if _, err := f.srv.Finish(toolContext(), &idemgatev1.FinishRequest{Scope: scope, Key: key, AttemptToken: "attempt-" + key, Epoch: epoch, Outcome: outcome}); err != nil {
		t.Fatalf("Finish %s: %v", key, err)
	}
}

// unknown makes an outcome-unknown record of key: its attempt cannot tell
// whether the side effect happened.
func (f *fixture) unknown(t *testing.T, key string) {
	t.Helper()
	_, epoch := f.begin(t, key)
	if _, err := f.srv.Release(toolContext(), &idemgatev1.ReleaseRequest{Scope: scope, Key: key, AttemptToken: "attempt-" + key, Epoch: epoch, OutcomeUnknown: true}); err != nil {
		t.Fatalf("Release %s: %v", key, err)
	}
}

func (f *fixture) state(t *testing.T, key string) string {
	t.Helper()
	resp, err := f.admin.GetRecord(context.Background(), &idemgatev1.GetRecordRequest{Ref: ref(key)})
	if err != nil {
		t.Fatalf("GetRecord %s: %v", key, err)
	}
	return resp.GetRecord().GetState()
}

// runsAgain reports whether the next call with key would run its side
// effect: a Begin reserves it.
func (f *fixture) runsAgain(t *testing.T, key string) bool {
	t.Helper()
	resp, _ := f.begin(t, key)
	return resp.GetReserved() != nil
}

func ref(key string) *idemgatev1.RecordRef {
	return &idemgatev1.RecordRef{Namespace: namespace, Scope: scope, Key: key}
}

func refForm(key string) url.Values {
	return url.Values{"ns": {namespace}, "scope": {scope}, "key": {key}}
}

// browser is an HTTP client with its own cookies that does not follow
// redirects, so each answer can be checked.
type browser struct {
	t      *testing.T
	client *http.Client
	base   string
}

func (f *fixture) browser(t *testing.T) *browser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &browser{t: t, base: f.server.URL, client: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) do(method, path string, form url.Values) (*http.Response, string) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := b.client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return resp, string(text)
}

func (b *browser) get(path string) (*http.Response, string) { return b.do(http.MethodGet, path, nil) }

func (b *browser) post(path string, form url.Values) (*http.Response, string) {
	return b.do(http.MethodPost, path, form)
}

var (
	loginCSRF = regexp.MustCompile(`name="login_csrf" value="([^"]+)"`)
	formCSRF  = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
)

func field(t *testing.T, re *regexp.Regexp, page string) string {
	t.Helper()
	m := re.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no %s in the page:\n%s", re, page)
	}
	return m[1]
}

// login signs in with token and returns the answer.
func (b *browser) login(token string) (*http.Response, string) {
	b.t.Helper()
	_, page := b.get("/login")
	return b.post("/login", url.Values{"login_csrf": {field(b.t, loginCSRF, page)}, "token": {token}})
}

// signedIn signs in as the admin and returns the session's CSRF token.
func (b *browser) signedIn() string {
	b.t.Helper()
	if resp, page := b.login(adminToken); resp.StatusCode != http.StatusSeeOther {
		b.t.Fatalf("admin sign-in: %s\n%s", resp.Status, page)
	}
	resp, page := b.get("/")
	if resp.StatusCode != http.StatusOK {
		b.t.Fatalf("overview after sign-in: %s\n%s", resp.Status, page)
	}
	return field(b.t, formCSRF, page)
}

// Package console is the Dedupe service's operator console: server-rendered
// HTML pages (Go templates embedded in the binary, no script) over the
// service's own admin API, called in-process, so every check the admin RPCs
// make (validation, errors, the forget refusal of unsettled records)
// applies to the console exactly as to idemctl.
//
// Operators sign in with a bearer token that has the admin right in the
// service's token file, or with a verified client certificate whose
// identity is an admin identity; both are checked by the service's own
// auth.Authenticator on every request, so a token removed from the file
// ends its sessions at the next request. Sessions live in memory, behind a
// random HttpOnly, SameSite=Strict cookie; every form carries the
// session's CSRF token; every action writes one audit log line.
//
// The service does not link its tool servers' code: given their
// descriptors (Config.Descriptors, a FileDescriptorSet), the console
// decodes their stored outcomes to JSON and completes an outcome-unknown
// record with an outcome typed as the JSON of its method's response.
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/outcomejson"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Authenticator establishes the caller of a request from the credentials
// in ctx (an "authorization: Bearer" incoming metadata value, or a gRPC
// peer with a verified client certificate), as the Dedupe service's
// *auth.Authenticator does for its gRPC calls.
type Authenticator interface {
	Authenticate(ctx context.Context) (dedupesvc.Caller, error)
}

// Config configures a Console. Admin and Authenticator are required.
type Config struct {
	// Admin is the admin API the console calls in-process (a
	// *dedupesvc.AdminServer). Required.
	Admin idemgatev1.AdminServiceServer
	// Authenticator checks the pasted tokens and client certificates; only
	// callers it names admins are let in. Required.
	Authenticator Authenticator
	// Logger gets the audit lines (one per action) and refused sign-ins.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// SessionIdle ends a session unused this long. Defaults to
	// DefaultSessionIdle, 30m.
	SessionIdle time.Duration
	// SessionMaxAge ends a session this long after sign-in, used or not.
	// Defaults to DefaultSessionMaxAge, 8h.
	SessionMaxAge time.Duration
	// MaxSessions bounds the sessions kept at once; signing in past it ends
	// the oldest. Defaults to DefaultMaxSessions, 256.
	MaxSessions int
	// CountsMaxAge is how old the overview's counts by state and method
	// may be before a page opened starts a recount in the background (and
	// shows the older ones meanwhile): counting scans every record. A
	// negative value counts on every overview. Defaults to
	// DefaultCountsMaxAge, 10s.
	CountsMaxAge time.Duration
	// Usage lists each namespace's quota usage for the Tenants page: the
	// service's store when it is a dedupesvc.UsageLister (both stores are).
	// Defaults to nil: the page says the store cannot list it.
	Usage dedupesvc.UsageLister
	// MaxRecords and MaxBytes are the service's quotas per caller
	// (-caller-max-records, -caller-max-bytes), shown against each
	// namespace's usage. Default 0: no limit.
	MaxRecords, MaxBytes int64
	// Metrics is the service's Prometheus registry: the Tenants page reads
	// its quota refusal counters (idemgate_dedupe_quota_exceeded_total),
	// the Activity page samples its RPC and stage latency histograms and
	// refusal counters. Defaults to nil: no refusals, no Activity charts.
	Metrics prometheus.Gatherer
	// ActivityInterval is how often the Activity page's sampler gathers
	// Metrics: each interval is one point of its charts, and the last
	// ActivityWindow of them are kept (at most 600). A negative value turns
	// the sampler off. Defaults to DefaultActivityInterval, 10s.
	ActivityInterval time.Duration
	// Health checks the store for the overview, within 2s (its context's
	// deadline); internal/dedupeapp checks PostgreSQL (and Citus's
	// workers) or the embedded store. Defaults to nil: no health shown.
	Health func(context.Context) StoreHealth
	// Descriptors are the types of the gated tool servers' methods, read
	// from a FileDescriptorSet (-console-descriptors; outcomejson.ReadFile
	// reads one). With them a key's page decodes a stored outcome of those
	// types to JSON, and an outcome-unknown record can be completed with
	// an outcome typed as the JSON of its method's response. Defaults to
	// nil: none; such outcomes show as base64, and completing a record is
	// left to idemctl resolve -complete-json.
	Descriptors *protoregistry.Files
	// SecureCookies marks cookies Secure (sent over HTTPS only); set it when
	// the console is served over TLS. A request that arrived over TLS gets
	// Secure cookies anyway. Defaults to false.
	SecureCookies bool
}

// Defaults of Config, and the console's fixed bounds.
const (
	// DefaultSessionIdle is Config.SessionIdle's default: 30m, an
	// incident's pause, not a night.
	DefaultSessionIdle = 30 * time.Minute
	// DefaultSessionMaxAge is Config.SessionMaxAge's default: 8h, a shift.
	DefaultSessionMaxAge = 8 * time.Hour
	// DefaultMaxSessions is Config.MaxSessions' default: 256.
	DefaultMaxSessions = 256
	// DefaultCountsMaxAge is Config.CountsMaxAge's default: 10s, about a
	// reload during an incident.
	DefaultCountsMaxAge = 10 * time.Second
	// DefaultActivityInterval is Config.ActivityInterval's default: 10s,
	// 60 points over the 10 minutes shown, as a Prometheus scrape would.
	DefaultActivityInterval = 10 * time.Second
	// MaxFormBytes bounds a request body: the forms hold a token, a
	// record's name, a CSRF token and an outcome's JSON (at most a little
	// under 64 KiB of it, above what most services let an outcome be).
	MaxFormBytes = 64 << 10
	// PageSize is how many records a list page shows.
	PageSize = 50
)

// Console serves the operator console's pages, static file and actions. It
// is an http.Handler; serve it behind httplimits (timeouts, connection
// caps), over TLS off loopback.
type Console struct {
	cfg      Config
	pages    map[string]*template.Template
	static   http.Handler
	mux      *http.ServeMux
	sessions *sessions
	counts   *counts
	// types finds the types of stored outcomes: those linked into the
	// service, then Config.Descriptors'.
	types outcomejson.Resolver
	// activity samples Metrics for the Activity page; nil when off.
	activity *activity
	// loginLog bounds the refused sign-in lines, so a flood of guesses is
	// visible without flooding the log.
	loginLog *rate.Limiter
}

// New returns the console cfg describes, its templates parsed (an error
// only if the embedded templates are broken, or Admin or Authenticator is
// missing).
func New(cfg Config) (*Console, error) {
	if cfg.Admin == nil || cfg.Authenticator == nil {
		return nil, errors.New("console: Config.Admin and Config.Authenticator are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SessionIdle <= 0 {
		cfg.SessionIdle = DefaultSessionIdle
	}
	if cfg.SessionMaxAge <= 0 {
		cfg.SessionMaxAge = DefaultSessionMaxAge
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.CountsMaxAge == 0 {
		cfg.CountsMaxAge = DefaultCountsMaxAge
	}
	if cfg.ActivityInterval == 0 {
		cfg.ActivityInterval = DefaultActivityInterval
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, pages: pages, static: http.StripPrefix("/static/", http.FileServerFS(sub)),
		sessions: newSessions(cfg.SessionIdle, cfg.SessionMaxAge, cfg.MaxSessions), loginLog: rate.NewLimiter(1, 10),
		counts: newCounts(cfg.Admin, cfg.CountsMaxAge, cfg.Logger), types: outcomejson.Types(cfg.Descriptors)}
	c.routes()
	c.activity = newActivity(cfg.Metrics, cfg.ActivityInterval, cfg.Logger)
	return c, nil
}

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{"bytes": byteSize, "stamp": stamp, "age": age, "method": dedupesvc.MethodOf, "tenant": tenantOf, "consequence": consequence}
	pages := map[string]*template.Template{}
	for _, name := range []string{"login", "overview", "records", "record", "resolve", "complete", "forget", "done", "error", "tenants", "activity"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/fields.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

func (c *Console) routes() {
	m := http.NewServeMux()
	m.Handle("GET /static/console.css", c.static)
	m.HandleFunc("GET /login", c.loginPage)
	m.HandleFunc("POST /login", c.login)
	m.HandleFunc("POST /logout", c.authed(c.logout))
	m.HandleFunc("GET /{$}", c.authed(c.overview))
	m.HandleFunc("GET /records", c.authed(c.records))
	m.HandleFunc("GET /record", c.authed(c.record))
	m.HandleFunc("GET /tenants", c.authed(c.tenants))
	m.HandleFunc("GET /activity", c.authed(c.activityPage))
	m.HandleFunc("GET /resolve", c.authed(c.resolvePage))
	m.HandleFunc("POST /resolve", c.authed(c.resolve))
	m.HandleFunc("GET /forget", c.authed(c.forgetPage))
	m.HandleFunc("POST /forget", c.authed(c.forget))
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, nil, http.StatusNotFound, "No such page", "There is no console page at this address. Go to the overview.")
	})
	c.mux = m
}

// Close ends the console's background work (a recount of the overview's
// counts under way, the Activity page's sampler) and waits for it; call it
// after the HTTP server that serves the console has shut down, before the
// store closes. Calling it again does nothing.
func (c *Console) Close() {
	c.counts.close()
	c.activity.close()
}

// ServeHTTP implements http.Handler: every answer gets the security
// headers, and every request body is bounded by MaxFormBytes.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// No script at all; styles and images from the console only; forms post
	// to the console only; never framed.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if r.TLS != nil {
		h.Set("Strict-Transport-Security", "max-age=31536000")
	}
	r.Body = http.MaxBytesReader(w, r.Body, MaxFormBytes)
	c.mux.ServeHTTP(w, r)
}

// operator is the signed-in operator of a request.
type operator struct {
	caller  dedupesvc.Caller
	session *session
}

// authed runs h for a signed-in admin, whose credentials are checked again
// by the Authenticator (a removed token, or another certificate, ends the
// session), and checks the CSRF token of every POST.
func (c *Console) authed(h func(http.ResponseWriter, *http.Request, operator)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := c.sessions.get(c.sessionID(r))
		if s == nil {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/login", http.StatusSeeOther)
				return
			}
			c.fail(w, r, nil, http.StatusForbidden, "Not signed in", "Your session has ended or never began: nothing was changed. Sign in again and repeat the action.")
			return
		}
		caller, err := c.cfg.Authenticator.Authenticate(credentialContext(r, s.secret))
		if err != nil || !caller.Admin || caller.Name != s.name {
			c.sessions.end(s.id)
			c.fail(w, r, nil, http.StatusForbidden, "Signed out", "Your credentials are no longer accepted (the token was removed from the token file, lost its admin right, or the client certificate changed): nothing was changed. Sign in again.")
			return
		}
		if r.Method == http.MethodPost {
			if err := r.ParseForm(); err != nil {
				c.fail(w, r, nil, http.StatusBadRequest, "Unreadable form", "The form could not be read ("+err.Error()+"): nothing was changed. Go back and submit it again.")
				return
			}
			if !equal(r.PostForm.Get("csrf"), s.csrf) {
				c.fail(w, r, nil, http.StatusForbidden, "Form refused", "The form did not carry this session's CSRF token, so it may not come from this console: nothing was changed. Open the page again from the console and submit it there.")
				return
			}
		}
		h(w, r, operator{caller: caller, session: s})
	}
}

// credentialContext is the request's credentials as the Authenticator
// reads a gRPC call's: the bearer token as incoming metadata, the verified
// client certificate as the peer's TLS state.
func credentialContext(r *http.Request, token string) context.Context {
	ctx := r.Context()
	if token != "" {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+token))
	}
	if r.TLS != nil {
		ctx = peer.NewContext(ctx, &peer.Peer{AuthInfo: credentials.TLSInfo{State: *r.TLS}})
	}
	return ctx
}

// certAdmin is the identity of the request's verified client certificate
// when the Authenticator makes it an admin, else "".
func (c *Console) certAdmin(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
		return ""
	}
	caller, err := c.cfg.Authenticator.Authenticate(credentialContext(r, ""))
	if err != nil || !caller.Admin {
		return ""
	}
	return caller.Name
}

func equal(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// randomToken is 32 random bytes, URL-safe base64.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b)
}

// secure reports whether r's cookies must be Secure.
func (c *Console) secure(r *http.Request) bool { return c.cfg.SecureCookies || r.TLS != nil }

// cookieName is the session cookie's name: with the __Host- prefix over
// TLS, which browsers only accept Secure, host-only and for path /.
func (c *Console) cookieName(r *http.Request, base string) string {
	if c.secure(r) {
		return "__Host-" + base
	}
	return base
}

func (c *Console) sessionID(r *http.Request) string {
	ck, err := r.Cookie(c.cookieName(r, "idemgate_console"))
	if err != nil {
		return ""
	}
	return ck.Value
}

func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, base, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: c.cookieName(r, base), Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: c.secure(r), SameSite: http.SameSiteStrictMode})
}

// sessions are the signed-in operators, in memory: a restart signs
// everyone out.
type sessions struct {
	mu           sync.Mutex
	byID         map[string]*session
	idle, maxAge time.Duration
	max          int
}

type session struct {
	id, csrf string
	// name is the operator: the token's name or the certificate identity.
	name string
	// secret is the bearer token the operator signed in with, checked again
	// on every request; empty for a certificate, presented on every
	// request anyway.
	secret            string
	created, lastSeen time.Time
}

func newSessions(idle, maxAge time.Duration, max int) *sessions {
	return &sessions{byID: map[string]*session{}, idle: idle, maxAge: maxAge, max: max}
}

func (s *sessions) start(name, secret string) *session {
	now := time.Now()
	ss := &session{id: randomToken(), csrf: randomToken(), name: name, secret: secret, created: now, lastSeen: now}
	s.mu.Lock()
	defer s.mu.Unlock()
	var oldest *session
	for id, o := range s.byID {
		if s.expired(o, now) {
			delete(s.byID, id)
		} else if oldest == nil || o.created.Before(oldest.created) {
			oldest = o
		}
	}
	if len(s.byID) >= s.max && oldest != nil {
		delete(s.byID, oldest.id)
	}
	s.byID[ss.id] = ss
	return ss
}

func (s *sessions) expired(ss *session, now time.Time) bool {
	return now.Sub(ss.lastSeen) > s.idle || now.Sub(ss.created) > s.maxAge
}

// get returns the live session id names, marking it used, or nil.
func (s *sessions) get(id string) *session {
	if id == "" {
		return nil
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.byID[id]
	if ss == nil {
		return nil
	}
	if s.expired(ss, now) {
		delete(s.byID, id)
		return nil
	}
	ss.lastSeen = now
	return ss
}

func (s *sessions) end(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, id)
}

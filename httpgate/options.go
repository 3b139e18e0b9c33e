package httpgate

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/replayfields"
)

// Defaults of a RoutePolicy's zero fields.
const (
	// DefaultRetention is how long an outcome is replayed: 24h.
	DefaultRetention = gatecore.DefaultRetention
	// DefaultLease is how long a reservation is held without a heartbeat:
	// 10s.
	DefaultLease = gatecore.DefaultLease
	// DefaultMaxWait is how long a duplicate waits for an in-flight
	// original before it gets 409: 3s.
	DefaultMaxWait = gatecore.DefaultMaxWait
	// DefaultExecutionTimeout bounds the handler's run: 60s.
	DefaultExecutionTimeout = gatecore.DefaultExecutionTimeout
	// DefaultKeylessWindow is how long identical keyless requests collapse
	// into one under KeylessFingerprint: 60s.
	DefaultKeylessWindow = gatecore.DefaultKeylessWindow
	// DefaultMaxBodyBytes is the largest request body a gated route reads:
	// 1 MiB.
	DefaultMaxBodyBytes = 1 << 20
)

// RoutePolicy is the policy of the requests a route pattern matches
// (WithRoute), or of the requests gated by method (WithDefaultPolicy). Zero
// fields take the defaults named.
type RoutePolicy struct {
	// NotGated exempts the route: its requests pass through untouched,
	// whatever their method. Defaults to false: the route is gated.
	NotGated bool
	// Retention is how long an outcome is replayed. Defaults to 24h.
	Retention time.Duration
	// Lease is how long a reservation is held without a heartbeat before it
	// counts as abandoned; renewed every third of it while the handler runs.
	// Defaults to 10s.
	Lease time.Duration
	// MaxWait is how long a duplicate that arrives while the original runs
	// waits for its outcome before it gets 409 IDEMPOTENCY_IN_FLIGHT.
	// Defaults to 3s.
	MaxWait time.Duration
	// NoWait answers a duplicate that arrives while the original runs at
	// once with 409 IDEMPOTENCY_IN_FLIGHT (and its retry delay) instead of waiting:
	// what max_wait 0s says in a gRPC method's policy, since a zero MaxWait
	// takes the default. MaxWait must be 0 with it. Defaults to false.
	NoWait bool
	// ExecutionTimeout bounds the handler's run: its request context ends
	// with the cause idemgate.ErrExecutionTimeout. Defaults to 60s.
	ExecutionTimeout time.Duration
	// OnLostOutcome is what a request finds after an attempt lost its lease
	// without an outcome, or whose handler marked its outcome unknown:
	// FAIL_CLOSED refuses it (409 IDEMPOTENCY_OUTCOME_UNKNOWN) until an
	// operator or the Reconciler settles the record, REEXECUTE runs the
	// handler again. Defaults to FAIL_CLOSED.
	OnLostOutcome idemgatev1.LostOutcomePolicy
	// FinishAfterReply answers the caller before its outcome is stored and
	// stores it right after (FINISH_POLICY_AFTER_REPLY): one Dedupe round
	// trip less on the caller's path, at the price of a duplicate that
	// arrives in between waiting or getting 409. Defaults to false.
	FinishAfterReply bool
	// KeylessFingerprint deduplicates a request without Idempotency-Key on
	// its fingerprint for KeylessWindow instead of refusing it with 400
	// IDEMPOTENCY_KEY_MISSING. Defaults to false.
	KeylessFingerprint bool
	// KeylessWindow is how long identical keyless requests collapse into
	// one. Defaults to 60s.
	KeylessWindow time.Duration
	// FingerprintHeaders name request header fields that enter the
	// fingerprint besides the method, the route, the target and the body
	// (say, a tenant or API-version header). Defaults to none.
	FingerprintHeaders []string
	// ReplayClientErrors stores a 4xx response as the action's outcome and
	// replays it. Defaults to false: a 4xx releases the key, so a retry
	// (after the caller fixed its request) runs the handler again.
	ReplayClientErrors bool
	// ReplayServerErrors stores a 5xx response as the action's outcome and
	// replays it. Defaults to false: a 5xx releases the key, so a retry runs
	// the handler again; a handler that cannot tell whether its side effect
	// happened marks its response with MarkOutcomeUnknown instead.
	ReplayServerErrors bool
	// MaxBodyBytes is the largest request body read; a larger one is
	// refused with 413 before anything runs. Defaults to 1 MiB.
	MaxBodyBytes int64
	// Reconciler, when set, is asked what happened to an earlier attempt's
	// lost outcome before the request is refused with
	// IDEMPOTENCY_OUTCOME_UNKNOWN. Defaults to none.
	Reconciler Reconciler
}

// Reconciler finds out what happened to an earlier attempt whose outcome
// was lost, from the system the handler writes to (the provider's record of
// the charge). It gets the key, the request (its body already read: body)
// and answers ResolvedResponse, ResolvedNotRun or StillUnknown; an error
// leaves the outcome unknown.
type Reconciler func(ctx context.Context, key string, r *http.Request, body []byte) (Resolution, error)

// TenantFunc names the tenant of a request, which namespaces its keys so
// two tenants using one key never share a record (the draft's "unique per
// client"). An error refuses the request with 401 IDEMPOTENCY_UNAUTHENTICATED
// and the error's text.
type TenantFunc func(r *http.Request) (string, error)

type options struct {
	logger         *slog.Logger
	tenant         TenantFunc
	methods        []string
	defaultPolicy  RoutePolicy
	routes         []routeRule
	dedupeTimeout  time.Duration
	outcomeTimeout time.Duration
	finishBudget   time.Duration
	inFlightRetry  time.Duration
	storeRetry     time.Duration
	maxOutcome     int
	registerer     prometheus.Registerer
	problemBase    string
	// replayEntries and replayBytes bound the replay cache; 0 turns it off.
	replayEntries, replayBytes int
	replayTTL                  time.Duration
	dedupeConn                 *grpc.ClientConn
	// dedupeLogEvery is WithDedupeFailureLogInterval's.
	dedupeLogEvery time.Duration
	// perCallerNames are WithPerCallerHeaders'; perCaller is their rule,
	// made by New.
	perCallerNames []string
	perCaller      replayfields.Rule
}

type routeRule struct {
	pattern string
	policy  RoutePolicy
}

var defaultOptions = options{
	logger:        slog.Default(),
	tenant:        func(*http.Request) (string, error) { return "", nil },
	methods:       []string{http.MethodPost, http.MethodPatch},
	inFlightRetry: time.Second,
	storeRetry:    time.Second,
	maxOutcome:    1 << 20,
	replayTTL:     gatecore.DefaultReplayCacheTTL,
	problemBase:   DefaultProblemTypeBase,
}

// Option configures New.
type Option func(*options)

// WithRoute sets the policy of the requests pattern matches, a Go 1.22
// http.ServeMux pattern ("POST /charges", "PATCH /charges/{id}",
// "/webhooks/"): gated with p, or exempt with p.NotGated, whatever the
// method. When several patterns match, the most specific wins, as in
// ServeMux; New fails on an invalid pattern or two that conflict. Defaults
// to none: requests are gated by method (WithGatedMethods).
func WithRoute(pattern string, p RoutePolicy) Option {
	return func(o *options) { o.routes = append(o.routes, routeRule{pattern: pattern, policy: p}) }
}

// WithGatedMethods sets the methods whose requests are gated when no
// WithRoute pattern matches them. Defaults to POST and PATCH, the methods
// the Idempotency-Key draft names as not idempotent: GET, HEAD, OPTIONS and
// TRACE are safe, and PUT and DELETE are idempotent by HTTP semantics
// (RFC 9110 9.2.2), so they pass through unless a route gates them.
func WithGatedMethods(methods ...string) Option {
	return func(o *options) { o.methods = methods }
}

// WithDefaultPolicy sets the policy of requests gated by method (no
// WithRoute pattern matched). Defaults to the zero RoutePolicy (every field
// its default).
func WithDefaultPolicy(p RoutePolicy) Option { return func(o *options) { o.defaultPolicy = p } }

// WithTenant sets the function that names the tenant of each request.
// Defaults to one tenant, "", shared by every caller: set it when callers
// are not one client.
func WithTenant(f TenantFunc) Option { return func(o *options) { o.tenant = f } }

// WithLogger sets the logger for what the caller does not see. Defaults to
// slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithDedupeTimeout bounds each Begin (beyond the route's MaxWait).
// Defaults to 5s.
func WithDedupeTimeout(d time.Duration) Option { return func(o *options) { o.dedupeTimeout = d } }

// WithOutcomeTimeout bounds each attempt to store an outcome. Defaults to
// 5s.
func WithOutcomeTimeout(d time.Duration) Option { return func(o *options) { o.outcomeTimeout = d } }

// WithFinishRetryBudget bounds how long an outcome the Dedupe service could
// not take is retried in the background (Close waits for it). Defaults to
// 1m.
func WithFinishRetryBudget(d time.Duration) Option { return func(o *options) { o.finishBudget = d } }

// WithInFlightRetryAfter sets the Retry-After of 409 IDEMPOTENCY_IN_FLIGHT.
// Defaults to 1s.
func WithInFlightRetryAfter(d time.Duration) Option { return func(o *options) { o.inFlightRetry = d } }

// WithStoreRetryAfter sets the Retry-After of 503
// IDEMPOTENCY_STORE_UNAVAILABLE. Defaults to 1s.
func WithStoreRetryAfter(d time.Duration) Option { return func(o *options) { o.storeRetry = d } }

// WithMaxOutcomeBytes sets the largest stored response; a larger one reaches
// its caller and duplicates get 507 IDEMPOTENCY_RESULT_TOO_LARGE. Defaults
// to 1 MiB, the Dedupe service's default limit.
func WithMaxOutcomeBytes(n int) Option { return func(o *options) { o.maxOutcome = n } }

// WithProblemTypeBase sets the URI prefix of the problem details' "type":
// the type of a refusal is the prefix plus its reason in lower case with
// dashes (e.g. "https://errors.example.com/idempotency-key-missing").
// Defaults to DefaultProblemTypeBase, whose types resolve to the reasons'
// sections of docs/gating.md.
func WithProblemTypeBase(base string) Option { return func(o *options) { o.problemBase = base } }

// WithRegisterer registers Prometheus metrics with reg:
// idemgate_httpgate_requests_total{route,outcome} (executed, replayed,
// released, or the reason a request was refused, such as key_missing or
// in_flight), idemgate_httpgate_events_total{route,event} (fenced,
// finish_retry, outcome_lost, ...; the same events as Stats) and
// idemgate_httpgate_stage_seconds{route,stage} (prepare, begin, handler,
// finish) and idemgate_httpgate_replay_age_seconds{route} (the age of each
// replayed outcome). route is the matched pattern, never the raw path.
// Defaults to none.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(o *options) { o.registerer = reg }
}

// WithReplayCache keeps the responses of completed requests in memory, at
// most maxEntries of them and about maxBytes in all (least recently used
// out first), so a duplicate with the same fingerprint is replayed without
// a round trip to the Dedupe service, with the same bytes and headers; with
// the interceptor's caveat: what changes at the service (a record resolved,
// or expired and run again through another replica) is not seen here until
// the entry's TTL (WithReplayCacheTTL) runs out. Off by default.
func WithReplayCache(maxEntries, maxBytes int) Option {
	return func(o *options) { o.replayEntries, o.replayBytes = maxEntries, maxBytes }
}

// WithReplayCacheTTL bounds how long a response is served from the replay
// cache; never past its record's expiry less 5s either. Defaults to 1m.
func WithReplayCacheTTL(d time.Duration) Option { return func(o *options) { o.replayTTL = d } }

// WithDedupeConn names the connection the Dedupe client passed to New uses:
// a Dedupe RPC that fails UNAVAILABLE makes it reconnect at once (at most
// every 500ms) instead of waiting out grpc-go's reconnect backoff, so a
// holder renews its lease within the grace a restarted Dedupe service
// grants it; the log lines about failing Dedupe RPCs name its target, and
// WatchDedupe follows its state. Defaults to none: reconnects keep the
// dial's backoff, and WatchDedupe goes by the RPCs' answers alone.
func WithDedupeConn(conn *grpc.ClientConn) Option { return func(o *options) { o.dedupeConn = conn } }

// WithDedupeFailureLogInterval sets how often at most a failing Dedupe RPC
// is logged: the first failure, and one with another status code, at once;
// while the same failure goes on, one line per interval. Defaults to
// DefaultDedupeFailureLogInterval, 10s.
func WithDedupeFailureLogInterval(d time.Duration) Option {
	return func(o *options) { o.dedupeLogEvery = d }
}

// WithPerCallerHeaders names more response header fields (case-insensitive)
// that belong to one caller, such as X-Caller: a gated handler's caller gets
// them, they are never stored, and a replay never carries them (not even
// from a record stored before they were named). Set-Cookie, Set-Cookie2,
// Authorization-Info, Proxy-Authentication-Info and every Access-Control-*
// field are per-caller always (docs/gating.md, "Response fields stored and
// replayed"). Defaults to none beyond those; calls add up.
func WithPerCallerHeaders(names ...string) Option {
	return func(o *options) { o.perCallerNames = append(o.perCallerNames, names...) }
}

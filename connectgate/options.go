package connectgate

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/replayfields"
)

// TenantFunc returns the tenant of a call, which namespaces its keys so two
// tenants using one key never share a record. An error fails the call with
// that error (return a *connect.Error such as CodeUnauthenticated). Give
// the interceptor the same function, so a key used over gRPC and over
// Connect names one record.
type TenantFunc func(ctx context.Context) (string, error)

// SharedTenant names no tenant: every caller shares one namespace of keys,
// as interceptor.PeerTenant does over plaintext.
func SharedTenant(context.Context) (string, error) { return "", nil }

type options struct {
	tenant         TenantFunc
	files          *protoregistry.Files
	logger         *slog.Logger
	dedupeTimeout  time.Duration
	inFlightRetry  time.Duration
	storeRetry     time.Duration
	outcomeTimeout time.Duration
	finishBudget   time.Duration
	reconcilers    map[string]idemgate.Reconciler
	maxOutcome     int
	// maxRequest and maxResponse: see WithMaxRequestBytes and
	// WithMaxResponseBytes.
	maxRequest, maxResponse int
	// replayEntries and replayBytes bound the replay cache; 0 turns it off.
	replayEntries, replayBytes int
	replayTTL                  time.Duration
	// dedupeConn and dedupeLogEvery: see WithDedupeConn.
	dedupeConn     *grpc.ClientConn
	dedupeLogEvery time.Duration
	registerer     prometheus.Registerer
	// perCallerNames are WithPerCallerHeaders'; perCaller is their rule,
	// made by New.
	perCallerNames []string
	perCaller      replayfields.Rule
}

var defaultOptions = options{
	tenant:         SharedTenant,
	files:          protoregistry.GlobalFiles,
	logger:         slog.Default(),
	dedupeTimeout:  5 * time.Second,
	inFlightRetry:  time.Second,
	storeRetry:     time.Second,
	outcomeTimeout: 5 * time.Second,
	finishBudget:   time.Minute,
	maxOutcome:     gatecore.DefaultMaxOutcomeBytes,
	maxRequest:     DefaultMaxRequestBytes,
	maxResponse:    DefaultMaxResponseBytes,
	replayTTL:      gatecore.DefaultReplayCacheTTL,
	dedupeLogEvery: gatecore.DefaultDedupeFailureLogInterval,
}

// Option configures New.
type Option func(*options)

// WithTenant sets the function that names the tenant of each call.
// Defaults to SharedTenant: connect-go's interceptors do not see the TLS
// connection, so there is no PeerTenant here; return the identity your
// authentication (an HTTP middleware such as connectrpc.com/authn) put in
// the context, and give the interceptor the same function.
func WithTenant(f TenantFunc) Option {
	return func(o *options) { o.tenant = f }
}

// WithFiles sets the registry searched for service descriptors and their
// policies. Defaults to protoregistry.GlobalFiles.
func WithFiles(files *protoregistry.Files) Option {
	return func(o *options) { o.files = files }
}

// WithLogger sets the logger for failures the caller does not see (a
// Finish or Release that could not be stored). Defaults to slog.Default().
func WithLogger(logger *slog.Logger) Option {
	return func(o *options) { o.logger = logger }
}

// WithDedupeTimeout bounds each Begin call (plus the method's max_wait),
// within the caller's own deadline, so a hung Dedupe service fails the call
// with CodeUnavailable instead of hanging it. Defaults to 5s.
func WithDedupeTimeout(d time.Duration) Option {
	return func(o *options) { o.dedupeTimeout = d }
}

// WithOutcomeTimeout bounds each attempt to store an outcome (Finish or
// Release), detached from the caller's context. Defaults to 5s.
func WithOutcomeTimeout(d time.Duration) Option {
	return func(o *options) { o.outcomeTimeout = d }
}

// WithFinishRetryBudget bounds how long an outcome the Dedupe service could
// not take is retried in the background (interceptor.WithFinishRetryBudget
// says more). Defaults to 1m.
func WithFinishRetryBudget(d time.Duration) Option {
	return func(o *options) { o.finishBudget = d }
}

// WithMaxOutcomeBytes sets the largest serialized outcome stored for
// replay; a larger one is answered to its caller and stored as a marker, so
// duplicates get CodeFailedPrecondition (IDEMPOTENCY_RESULT_TOO_LARGE). New
// fails when it is over WithMaxResponseBytes, which could never send such an
// outcome again.
// Defaults to 1 MiB (interceptor.DefaultMaxOutcomeBytes).
func WithMaxOutcomeBytes(n int) Option {
	return func(o *options) { o.maxOutcome = n }
}

// WithMaxRequestBytes sets the largest request message a handler mounted
// with HandlerOptions and HTTPMiddleware reads: as sent (compressed or not)
// and once decompressed. A larger one is refused before it is decoded, with
// CodeResourceExhausted (ReasonRequestTooLarge): the key is not reserved
// and the handler does not run. New fails when n is not positive. Defaults
// to DefaultMaxRequestBytes, 4 MiB.
func WithMaxRequestBytes(n int) Option {
	return func(o *options) { o.maxRequest = n }
}

// WithMaxResponseBytes sets the largest response message a handler mounted
// with HandlerOptions sends (connect.WithSendMaxBytes): a larger one fails
// with connect-go's CodeResourceExhausted instead of being buffered whole
// for the client. The outcome of a gated call is stored before it is sent,
// so keep it at or above WithMaxOutcomeBytes for replays to be sendable.
// New fails when n is not positive. Defaults to DefaultMaxResponseBytes,
// 4 MiB.
func WithMaxResponseBytes(n int) Option {
	return func(o *options) { o.maxResponse = n }
}

// WithReconciler registers the Reconciler of one gated procedure
// ("/pkg.Service/Method"); the interceptor's reconcilers are the same type.
// New fails when the procedure is not gated. Defaults to none.
func WithReconciler(procedure string, r idemgate.Reconciler) Option {
	return func(o *options) {
		if o.reconcilers == nil {
			o.reconcilers = map[string]idemgate.Reconciler{}
		}
		o.reconcilers[procedure] = r
	}
}

// WithInFlightRetryAfter sets the RetryInfo delay sent with
// IDEMPOTENCY_IN_FLIGHT. Defaults to 1s.
func WithInFlightRetryAfter(d time.Duration) Option {
	return func(o *options) { o.inFlightRetry = d }
}

// WithStoreRetryAfter sets the RetryInfo delay sent with
// IDEMPOTENCY_STORE_UNAVAILABLE. Defaults to 1s.
func WithStoreRetryAfter(d time.Duration) Option {
	return func(o *options) { o.storeRetry = d }
}

// WithReplayCache keeps the outcomes of completed calls in memory, as
// interceptor.WithReplayCache does (its caveats hold here). Off by default.
func WithReplayCache(maxEntries, maxBytes int) Option {
	return func(o *options) { o.replayEntries, o.replayBytes = maxEntries, maxBytes }
}

// WithReplayCacheTTL bounds how long an outcome is served from the replay
// cache. Defaults to 1m (interceptor.DefaultReplayCacheTTL).
func WithReplayCacheTTL(d time.Duration) Option {
	return func(o *options) { o.replayTTL = d }
}

// WithDedupeConn names the connection the Gate's Dedupe client uses, as
// interceptor.WithDedupeConn does: failing Dedupe RPCs are logged with its
// target, WatchDedupe follows its connectivity, and an UNAVAILABLE answer
// makes it reconnect at once. Defaults to none.
func WithDedupeConn(conn *grpc.ClientConn) Option {
	return func(o *options) { o.dedupeConn = conn }
}

// WithDedupeFailureLogInterval sets how often at most a failing Dedupe RPC
// is logged while the same failure goes on. Defaults to
// 10s (interceptor.DefaultDedupeFailureLogInterval).
func WithDedupeFailureLogInterval(d time.Duration) Option {
	return func(o *options) { o.dedupeLogEvery = d }
}

// WithRegisterer registers the gate's Prometheus metrics with reg:
// idemgate_connectgate_calls_total{procedure,outcome} (executed, released
// when the handler's error was not stored, replayed, or the reason a call
// was refused, such as key_missing or in_flight),
// idemgate_connectgate_events_total{procedure,event} (fenced, finish_retry,
// outcome_lost, replay_cache_hit, ...; the same events as Stats) and the
// histogram idemgate_connectgate_stage_seconds{procedure,stage} (prepare,
// begin, handler, finish; buckets idemgate.StageBuckets). A second Gate
// on one registry shares the first one's collectors. Defaults to none: no
// metrics.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(o *options) { o.registerer = reg }
}

// WithPerCallerHeaders names more response headers (case-insensitive) that
// belong to one caller, such as X-Caller: the handler's caller gets them,
// they are never stored, and a replay never carries them (not even from a
// record stored before they were named). Set-Cookie, Set-Cookie2,
// Authorization-Info, Proxy-Authentication-Info and every Access-Control-*
// header are per-caller always (docs/gating.md, "Response fields stored and
// replayed"). Defaults to none beyond those; calls add up. Give the
// interceptor the same names (interceptor.WithPerCallerMetadata) when one
// key is used over both.
func WithPerCallerHeaders(names ...string) Option {
	return func(o *options) { o.perCallerNames = append(o.perCallerNames, names...) }
}

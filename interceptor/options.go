package interceptor

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/identity"
	"github.com/idemgate/idemgate/internal/replayfields"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// TenantFunc returns the tenant of a call, which namespaces its keys so two
// tenants using one key never share a record. An error fails the call with
// that error (return a status error such as UNAUTHENTICATED).
type TenantFunc func(ctx context.Context) (string, error)

// PeerTenant names the tenant by the tool server's caller as its transport
// verified it: the SPIFFE ID of the client certificate, else its subject,
// and "" (one shared tenant) when the connection carries no verified client
// certificate. It never reads metadata, which a caller could forge.
func PeerTenant(ctx context.Context) (string, error) {
	return identity.FromPeer(ctx), nil
}

type options struct {
	tenant         TenantFunc
	files          *protoregistry.Files
	types          *protoregistry.Types
	logger         *slog.Logger
	dedupeTimeout  time.Duration
	inFlightRetry  time.Duration
	storeRetry     time.Duration
	outcomeTimeout time.Duration
	finishBudget   time.Duration
	reconcilers    map[string]idemgate.Reconciler
	strict         bool
	strictServices []string
	maxOutcome     int
	registerer     prometheus.Registerer
	// replayEntries and replayBytes bound the replay cache; 0 turns it off.
	replayEntries, replayBytes int
	replayTTL                  time.Duration
	// dedupeConn and dedupeLogEvery: see dedupeconn.go.
	dedupeConn     *grpc.ClientConn
	dedupeLogEvery time.Duration
	// perCallerNames are WithPerCallerMetadata's; perCaller is their rule,
	// made by New.
	perCallerNames []string
	perCaller      replayfields.Rule
}

var defaultOptions = options{
	tenant:         PeerTenant,
	files:          protoregistry.GlobalFiles,
	types:          protoregistry.GlobalTypes,
	logger:         slog.Default(),
	dedupeTimeout:  5 * time.Second,
	inFlightRetry:  time.Second,
	storeRetry:     time.Second,
	outcomeTimeout: 5 * time.Second,
	finishBudget:   time.Minute,
	maxOutcome:     DefaultMaxOutcomeBytes,
	replayTTL:      DefaultReplayCacheTTL,
	dedupeLogEvery: DefaultDedupeFailureLogInterval,
}

// DefaultMaxOutcomeBytes is the largest serialized outcome stored for replay
// by default: 1 MiB, the Dedupe service's default limit.
const DefaultMaxOutcomeBytes = gatecore.DefaultMaxOutcomeBytes

// Option configures New.
type Option func(*options)

// WithTenant sets the function that names the tenant of each call. Defaults
// to PeerTenant: the caller's verified client certificate, or one shared
// tenant over plaintext. Plug in your own authentication by returning the
// identity your auth interceptor (chained before the gate) established.
func WithTenant(f TenantFunc) Option {
	return func(o *options) { o.tenant = f }
}

// WithFiles sets the registry searched for service descriptors and their
// policies. Defaults to protoregistry.GlobalFiles, which holds every
// generated .pb.go file linked into the binary.
func WithFiles(files *protoregistry.Files) Option {
	return func(o *options) { o.files = files }
}

// WithTypes sets the registry searched for response message types to replay
// into. Defaults to protoregistry.GlobalTypes; a type it lacks is replayed as
// a dynamicpb message built from the descriptor.
func WithTypes(types *protoregistry.Types) Option {
	return func(o *options) { o.types = types }
}

// WithLogger sets the logger for failures the caller does not see (a Finish
// or Release that could not be stored). Defaults to slog.Default().
func WithLogger(logger *slog.Logger) Option {
	return func(o *options) { o.logger = logger }
}

// WithDedupeTimeout bounds each Begin call, within the caller's own deadline,
// so a hung Dedupe service fails the call with UNAVAILABLE instead of hanging
// it. Defaults to 5s.
func WithDedupeTimeout(d time.Duration) Option {
	return func(o *options) { o.dedupeTimeout = d }
}

// WithOutcomeTimeout bounds each attempt to store an outcome (Finish or
// Release) after the handler returned. It runs detached from the caller's
// context, so a caller that gave up still gets its outcome recorded.
// Defaults to 5s.
func WithOutcomeTimeout(d time.Duration) Option {
	return func(o *options) { o.outcomeTimeout = d }
}

// WithFinishRetryBudget bounds how long the interceptor keeps retrying, with
// backoff, to store an outcome the Dedupe service could not take. The caller
// gets its response after the first attempt; the retries go on in the
// background (Close waits for them; once Close began, the caller makes them
// before its answer), renewing the lease meanwhile, so the key
// stays in flight and not even a REEXECUTE duplicate runs it again. When the
// budget runs out the outcome is lost: the renewals stop, the lease runs out
// and the record goes down the method's on_lost_outcome path. Defaults to 1m.
func WithFinishRetryBudget(d time.Duration) Option {
	return func(o *options) { o.finishBudget = d }
}

// WithMaxOutcomeBytes sets the largest serialized outcome (response or final
// error, with the response metadata the handler set) stored for replay. A
// larger one is still returned to its caller, and the record keeps a marker
// instead, without metadata, so duplicates get FAILED_PRECONDITION
// (IDEMPOTENCY_RESULT_TOO_LARGE) rather than running the side effect again.
// Keep it at or below the Dedupe service's -max-outcome-bytes. Defaults to
// DefaultMaxOutcomeBytes.
func WithMaxOutcomeBytes(n int) Option {
	return func(o *options) { o.maxOutcome = n }
}

// WithRegisterer registers the interceptor's Prometheus metrics with reg:
// idemgate_interceptor_calls_total{method,outcome} (executed, replayed, or
// the reason a call was refused, such as key_missing or in_flight),
// idemgate_interceptor_events_total{method,event} (fenced, finish_retry,
// release_retry, outcome_lost, ...; the same events as Stats) and the
// histogram idemgate_interceptor_replay_age_seconds{method} (for every
// answer from a stored outcome, from the Dedupe service or the replay
// cache, the seconds since it was stored; buckets ReplayAgeBuckets).
// Defaults to none.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(o *options) { o.registerer = reg }
}

// WithStrict makes New refuse to build while a method of the named services
// (full names, such as "examples.payments.v1.PaymentsService") is neither
// marked mutating nor declared safe with idempotency_level NO_SIDE_EFFECTS or
// IDEMPOTENT. With no names it holds every service in the registry to that,
// except gRPC's own grpc.* services; name yours when the binary links other
// libraries' services (an OpenTelemetry exporter links one), or use
// Gate.CheckServer, which checks exactly the services a server serves. By
// default such methods are left ungated and listed once in an Info log line
// when the Gate is built.
func WithStrict(services ...string) Option {
	return func(o *options) { o.strict, o.strictServices = true, services }
}

// WithReconciler registers the Reconciler of one gated method, by full
// method name ("/pkg.Service/Method"). New fails when the method is not
// gated. Defaults to none: a lost outcome answers IDEMPOTENCY_OUTCOME_UNKNOWN.
func WithReconciler(fullMethod string, r idemgate.Reconciler) Option {
	return func(o *options) {
		if o.reconcilers == nil {
			o.reconcilers = map[string]idemgate.Reconciler{}
		}
		o.reconcilers[fullMethod] = r
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

// WithReplayCache keeps the outcomes of completed calls in memory, at most
// maxEntries of them and about maxBytes in all (least recently used out
// first), so a duplicate whose request has the same fingerprint is replayed
// without a round trip to the Dedupe service: the same bytes, the
// idempotency-replayed, idempotency-original-time and idempotency-expires-at
// headers and the stored metadata, as a replay through the service, and
// observed in the replay age histogram alike. An entry this process filled
// from its own Finish carries its own estimate of the two times (when it
// sent the Finish), not the service's. A duplicate with another fingerprint still asks the service
// (IDEMPOTENCY_KEY_REUSED). An outcome is cached when its Finish succeeded
// and when Begin answered it completed.
//
// A cached outcome is served until the earlier of WithReplayCacheTTL and its
// record's expiry less ReplayCacheClockMargin, by this process's clock.
// Until then the service is not asked, so what changes there is not seen
// by this replica: a record an operator resolved or rewrote, deleted, or
// that another replica's caller saw expire and run again, is still
// answered with the cached outcome here for up to the TTL. Keep the TTL
// below how quickly such a change must show. Off by default.
func WithReplayCache(maxEntries, maxBytes int) Option {
	return func(o *options) { o.replayEntries, o.replayBytes = maxEntries, maxBytes }
}

// WithReplayCacheTTL bounds how long an outcome is served from the replay
// cache (WithReplayCache); it is never served past its record's expiry
// either. Defaults to DefaultReplayCacheTTL, 1m.
func WithReplayCacheTTL(d time.Duration) Option {
	return func(o *options) { o.replayTTL = d }
}

// WithPerCallerMetadata names more response metadata keys (case-insensitive)
// that belong to one caller, such as x-caller: the handler's caller gets
// them, they are never stored, and a replay never carries them (not even
// from a record stored before they were named). set-cookie, set-cookie2,
// authorization-info, proxy-authentication-info and every access-control-*
// key are per-caller always, as in httpgate and connectgate (docs/gating.md,
// "Response fields stored and replayed"). Defaults to none beyond those;
// calls add up. Give connectgate.WithPerCallerHeaders the same names when
// one key is used over both.
func WithPerCallerMetadata(keys ...string) Option {
	return func(o *options) { o.perCallerNames = append(o.perCallerNames, keys...) }
}

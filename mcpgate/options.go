package mcpgate

import (
	"context"
	"log/slog"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/mcpwire"
)

// TenantFunc names the tenant of a tools/call, which namespaces its keys so
// two tenants using one key never share a record. An error refuses the call:
// a gRPC status error as it is (code, reason), any other as UNAUTHENTICATED
// with its text.
type TenantFunc func(ctx context.Context, req *mcp.CallToolRequest) (string, error)

// DefaultTenant is the tenant of a call without an authenticated identity:
// "", one tenant shared by every such caller. Over stdio (and the SDK's
// in-memory and SSE transports, which carry no HTTP request to the gate)
// that is the one client of the server process. Over streamable HTTP it
// would be anyone who can reach the server, so a gated call there in
// DefaultTenant is refused UNAUTHENTICATED (ReasonUnauthenticated) unless
// the gate is WithSingleTenant.
const DefaultTenant = ""

// TokenTenant names the tenant by the MCP session's authenticated identity:
// the UserID of the bearer token's TokenInfo (go-sdk auth, in the request's
// Extra), or DefaultTenant when the request carries no token or the token
// names no user (refused over HTTP, see DefaultTenant).
func TokenTenant(_ context.Context, req *mcp.CallToolRequest) (string, error) {
	if req.Extra == nil || req.Extra.TokenInfo == nil {
		return DefaultTenant, nil
	}
	return req.Extra.TokenInfo.UserID, nil
}

// ToolPolicy is the explicit policy of one tool (WithTool). Zero durations
// take the defaults named.
type ToolPolicy struct {
	// NotGated records the decision that the tool is not gated: its calls
	// pass through. Defaults to false: the tool is gated.
	NotGated bool
	// KeyArgument names a top-level string argument that carries the key,
	// in addition to an argument the input schema marks with
	// "io.idemgate/idempotency-key": true. It never enters the fingerprint.
	// Defaults to none.
	KeyArgument string
	// AddKeyArgument, when set, adds a required string argument of this
	// name to the tool's input schema as tools/list shows it, marked as the
	// key (SchemaKey) and described for the model: the carrier for hosts
	// that send only the arguments the model writes and never _meta (a
	// stock desktop or IDE host). The gate takes it out of the arguments
	// before the tool runs, so the tool never sees it, and leaves it out of
	// the fingerprint. It protects a call the model repeats with the same
	// key; a model that makes up a new key for the same action runs it
	// again. Defaults to WithKeyArgument's name, or none.
	AddKeyArgument string
	// ExcludeArguments name top-level arguments left out of the
	// fingerprint (a timestamp, a trace id), in addition to those the input
	// schema marks with "io.idemgate/exclude-from-fingerprint": true.
	// Defaults to none.
	ExcludeArguments []string
	// ReplayErrors stores a result with isError true as the action's outcome
	// and replays it. Defaults to false: such a result releases the key, so
	// a retry runs the tool again.
	ReplayErrors bool
	// Retention is how long an outcome is replayed. Defaults to 24h.
	Retention time.Duration
	// Lease is how long a reservation is held without a heartbeat before it
	// counts as abandoned; renewed every third of it while the tool runs.
	// Defaults to 10s.
	Lease time.Duration
	// MaxWait is how long a duplicate that arrives while the original runs
	// waits for its outcome before it gets IDEMPOTENCY_IN_FLIGHT. Defaults
	// to 3s.
	MaxWait time.Duration
	// NoWait answers a duplicate that arrives while the original runs at
	// once with IDEMPOTENCY_IN_FLIGHT (and its retry delay) instead of waiting:
	// what max_wait 0s says in a gRPC method's policy, since a zero MaxWait
	// takes the default. MaxWait must be 0 with it. Defaults to false.
	NoWait bool
	// ExecutionTimeout bounds the tool's run; its context ends with
	// idemgate.ErrExecutionTimeout. Defaults to 60s.
	ExecutionTimeout time.Duration
	// OnLostOutcome is what a call finds after an attempt lost its lease
	// without an outcome. Defaults to FAIL_CLOSED.
	OnLostOutcome idemgatev1.LostOutcomePolicy
	// KeylessFingerprint deduplicates a call without a key on its
	// fingerprint for KeylessWindow instead of refusing it with
	// IDEMPOTENCY_KEY_MISSING. Defaults to false.
	KeylessFingerprint bool
	// KeylessWindow is how long identical keyless calls collapse into one.
	// Defaults to 60s.
	KeylessWindow time.Duration
	// FinishAfterReply answers the caller before the tool's outcome is
	// stored, and stores it right after (the gRPC policy's
	// FINISH_POLICY_AFTER_REPLY): a Dedupe round trip less on the answer,
	// at the price that a duplicate arriving before the store finishes gets
	// IDEMPOTENCY_IN_FLIGHT, and an outcome whose store fails is lost (down
	// the OnLostOutcome path), not refused to the caller. Defaults to
	// false: stored before the answer.
	FinishAfterReply bool
	// Reconcile, when set, is asked what happened when a call finds that an
	// earlier attempt's outcome was lost (FAIL_CLOSED): a payment provider
	// can be asked whether a charge with this key exists. Its answer
	// settles the record; an error or StillUnknown leaves the call refused
	// IDEMPOTENCY_OUTCOME_UNKNOWN. Defaults to none.
	Reconcile Reconciler
}

type options struct {
	serverName     string
	tenant         TenantFunc
	tools          map[string]ToolPolicy
	strict         bool
	logger         *slog.Logger
	dedupeTimeout  time.Duration
	outcomeTimeout time.Duration
	finishBudget   time.Duration
	inFlightRetry  time.Duration
	storeRetry     time.Duration
	maxOutcome     int
	registerer     prometheus.Registerer
	// replayEntries and replayBytes bound the replay cache; 0 turns it off.
	replayEntries, replayBytes int
	replayTTL                  time.Duration
	// dedupeConn is the Dedupe client's connection (WithDedupeConn).
	dedupeConn *grpc.ClientConn
	// dedupeLogEvery is WithDedupeFailureLogInterval's.
	dedupeLogEvery time.Duration
	// keyArgument is WithKeyArgument's.
	keyArgument string
	// maxArgs is WithMaxArgumentBytes'.
	maxArgs int
	// singleTenant is WithSingleTenant's.
	singleTenant bool
}

var defaultOptions = options{
	tenant:        TokenTenant,
	logger:        slog.Default(),
	maxOutcome:    1 << 20,
	maxArgs:       DefaultMaxArgumentBytes,
	inFlightRetry: time.Second,
	storeRetry:    time.Second,
	replayTTL:     gatecore.DefaultReplayCacheTTL,
}

// Option configures New.
type Option func(*options)

// WithServerName sets the server name in every record's scope, so two
// servers sharing a Dedupe namespace never share a record: printable ASCII
// without "|". Defaults to the name the server reports in its
// implementation info (mcp.NewServer's Implementation.Name).
func WithServerName(name string) Option { return func(o *options) { o.serverName = name } }

// WithTenant sets the function that names the tenant of each call.
// Defaults to TokenTenant. New refuses nil.
func WithTenant(f TenantFunc) Option { return func(o *options) { o.tenant = f } }

// WithSingleTenant says the server has one tenant: a gated call over HTTP
// without an authenticated identity runs in DefaultTenant, shared with
// every other such caller, who is replayed its result for the same key.
// Defaults to off: such a call is refused UNAUTHENTICATED
// (ReasonUnauthenticated). Calls over stdio are always in DefaultTenant, and
// callers with an identity always in their own.
func WithSingleTenant() Option { return func(o *options) { o.singleTenant = true } }

// DefaultMaxArgumentBytes is WithMaxArgumentBytes' default: 4 MiB, the
// go-sdk's limit on a streamable HTTP request body.
const DefaultMaxArgumentBytes = 4 << 20

// WithMaxArgumentBytes bounds the arguments of a gated call, in bytes of
// JSON: larger ones are refused INVALID_ARGUMENT (ReasonArgumentsTooLarge)
// before the gate parses or fingerprints them, and the tool does not run.
// It bounds the work one call costs the gate (over stdio no other limit
// applies). Defaults to DefaultMaxArgumentBytes.
func WithMaxArgumentBytes(n int) Option { return func(o *options) { o.maxArgs = n } }

// WithTool sets the policy of the tool named name, whatever its annotations
// say. Defaults to none: a tool follows its annotations.
func WithTool(name string, p ToolPolicy) Option {
	return func(o *options) {
		if o.tools == nil {
			o.tools = map[string]ToolPolicy{}
		}
		o.tools[name] = p
	}
}

// DefaultKeyArgument is the name WithKeyArgument suggests:
// "idempotency_key".
const DefaultKeyArgument = mcpwire.DefaultKeyArgument

// WithKeyArgument adds the key argument name (ToolPolicy.AddKeyArgument) to
// every gated tool whose policy names none, for servers started by hosts
// that never set _meta. New fails when a gated tool already has a property
// of that name. Defaults to none.
func WithKeyArgument(name string) Option { return func(o *options) { o.keyArgument = name } }

// WithStrict makes New fail while the server has a tool that is neither
// named with WithTool nor annotated, and refuses calls to such a tool added
// later (IDEMPOTENCY_STORE_REJECTED, nothing runs). Defaults to off: such a
// tool is gated, by MCP's defaults for a tool without annotations.
func WithStrict() Option { return func(o *options) { o.strict = true } }

// WithLogger sets the logger for what the caller does not see. Defaults to
// slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithDedupeTimeout bounds each Begin (beyond the tool's MaxWait).
// Defaults to 5s.
func WithDedupeTimeout(d time.Duration) Option { return func(o *options) { o.dedupeTimeout = d } }

// WithOutcomeTimeout bounds each attempt to store an outcome. Defaults to
// 5s.
func WithOutcomeTimeout(d time.Duration) Option { return func(o *options) { o.outcomeTimeout = d } }

// WithFinishRetryBudget bounds how long an outcome the Dedupe service could
// not take is retried in the background (Close waits for it). Defaults to
// 1m.
func WithFinishRetryBudget(d time.Duration) Option { return func(o *options) { o.finishBudget = d } }

// WithInFlightRetryAfter sets the retry delay sent with
// IDEMPOTENCY_IN_FLIGHT. Defaults to 1s.
func WithInFlightRetryAfter(d time.Duration) Option { return func(o *options) { o.inFlightRetry = d } }

// WithStoreRetryAfter sets the retry delay sent with
// IDEMPOTENCY_STORE_UNAVAILABLE (retryAfterSeconds in the error's _meta).
// Defaults to 1s.
func WithStoreRetryAfter(d time.Duration) Option { return func(o *options) { o.storeRetry = d } }

// WithMaxOutcomeBytes sets the largest stored result; a larger one reaches
// its caller and duplicates get IDEMPOTENCY_RESULT_TOO_LARGE. Defaults to
// 1 MiB, the Dedupe service's default limit.
func WithMaxOutcomeBytes(n int) Option { return func(o *options) { o.maxOutcome = n } }

// WithRegisterer registers Prometheus counters with reg:
// idemgate_mcpgate_calls_total{tool,outcome} (executed, replayed, released,
// or the reason a call was refused, such as key_missing or in_flight) and
// idemgate_mcpgate_events_total{tool,event} (fenced, finish_retry,
// outcome_lost, ...; the same events as Stats). Defaults to none.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(o *options) { o.registerer = reg }
}

// WithReplayCache keeps the results of completed calls in memory, at most
// maxEntries of them and about maxBytes in all (least recently used out
// first), so a duplicate with the same fingerprint is replayed without a
// round trip to the Dedupe service, the same bytes and mark as a replay
// through it; the interceptor's replay cache, with its caveat: what changes
// at the service (a record resolved, or expired and run again through
// another replica) is not seen here until the entry's TTL
// (WithReplayCacheTTL) runs out. Off by default.
func WithReplayCache(maxEntries, maxBytes int) Option {
	return func(o *options) { o.replayEntries, o.replayBytes = maxEntries, maxBytes }
}

// WithReplayCacheTTL bounds how long a result is served from the replay
// cache; never past its record's expiry less 5s either. Defaults to 1m.
func WithReplayCacheTTL(d time.Duration) Option {
	return func(o *options) { o.replayTTL = d }
}

// WithDedupeConn names the connection the Dedupe client passed to New uses:
// a Dedupe RPC that fails UNAVAILABLE makes it reconnect at once (at most
// every 500ms) instead of waiting out grpc-go's reconnect backoff, which
// grows to two minutes during an outage, so a holder renews its lease
// within the one-lease grace a restarted Dedupe service grants it. Pass it
// whenever that client is a *grpc.ClientConn's: the log lines about failing
// Dedupe RPCs then name its target, and WatchDedupe follows its state.
// Defaults to none: reconnects keep the dial's backoff, WatchDedupe goes by
// the RPCs' answers alone, and New logs a warning saying so.
func WithDedupeConn(conn *grpc.ClientConn) Option {
	return func(o *options) { o.dedupeConn = conn }
}

// WithDedupeFailureLogInterval sets how often at most a failing Dedupe RPC
// is logged: the first failure, and one with another status code, at once;
// while the same failure goes on, one line per interval that counts the
// failures not logged in "suppressed". Defaults to
// DefaultDedupeFailureLogInterval, 10s.
func WithDedupeFailureLogInterval(d time.Duration) Option {
	return func(o *options) { o.dedupeLogEvery = d }
}

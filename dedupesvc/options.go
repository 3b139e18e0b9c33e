package dedupesvc

import (
	"context"
	"log/slog"
	"time"
)

// Notifier wakes Begins that wait for an in-flight attempt's outcome when the
// record of their key changes. It is a hint: a waiter also polls, so a lost
// notification only delays it.
type Notifier interface {
	// Subscribe returns a channel that receives after the in-flight record
	// id settles, and a function that ends the subscription.
	Subscribe(ctx context.Context, id RecordID) (<-chan struct{}, func())
}

type options struct {
	logger           *slog.Logger
	storeRetryAfter  time.Duration
	notifier         Notifier
	pollInterval     time.Duration
	unknownRetention time.Duration
	maxOutcome       int
	metrics          *Metrics
	callerRate       float64
	callerBurst      int
	callerRecords    int64
	callerBytes      int64
	maxRetention     time.Duration
	maxWaiters       int
	maxCallerWaiters int
	cipher           *OutcomeCipher
	replays          *ReplayRecorder
	outcomeRate      float64
	outcomeBurst     int
	finishInFlight   int
	resolveOnly      bool
	plaintextOK      bool
	maxBegins        int
}

var defaultOptions = options{
	logger:           slog.Default(),
	storeRetryAfter:  200 * time.Millisecond,
	pollInterval:     200 * time.Millisecond,
	unknownRetention: 7 * 24 * time.Hour,
	maxOutcome:       1 << 20,
	callerRate:       DefaultCallerRate,
	callerBurst:      DefaultCallerBurst,
	callerRecords:    DefaultCallerRecords,
	callerBytes:      DefaultCallerBytes,
	maxRetention:     DefaultMaxRetention,
	maxWaiters:       DefaultMaxWaiters,
	maxCallerWaiters: DefaultMaxCallerWaiters,
	outcomeRate:      DefaultCallerOutcomeRate,
	outcomeBurst:     DefaultCallerOutcomeBurst,
	finishInFlight:   DefaultMaxFinishBytesInFlight,
}

// DefaultMaxFinishBytesInFlight is how many outcome bytes each caller's
// Finishes may hold in the service at once (WithMaxFinishBytesInFlight):
// 32 MiB, 32 of the largest outcomes by default.
const DefaultMaxFinishBytesInFlight = 32 << 20

// WithMaxFinishBytesInFlight bounds the outcome bytes one caller's Finishes
// hold in the service at once, from the arrival of their headers to the end
// of the call, each counted at the size its gate declares
// (OutcomeBytesHeader), or at WithMaxOutcomeBytes when it declares none.
// AdmitFinishCall refuses a Finish past it from its headers, before its
// message is read: RESOURCE_EXHAUSTED, DEDUPE_QUOTA_EXCEEDED, quota
// "finish_bytes_in_flight", with RetryInfo. So a caller's flood of Finishes
// costs the service at most this much memory, and each caller's reading of
// messages, decoding and storing is bounded alike, whoever floods. At least
// the largest outcome; 0 is no limit. Defaults to
// DefaultMaxFinishBytesInFlight.
func WithMaxFinishBytesInFlight(n int) Option {
	return func(o *options) { o.finishInFlight = n }
}

// Defaults of the per-caller limits; see WithCallerRate, WithCallerQuota and
// WithMaxRetention.
const (
	// DefaultCallerRate is each caller's Begins per second: 10,000, above
	// what one store takes (on the 2-core machine of BENCHMARKS.md about
	// 7,000 fresh keys a second on PostgreSQL and 9,000 on the embedded
	// store at 64 callers), so that by default the limit never refuses a
	// single busy tool server the store could serve; production sets a
	// caller's share of its store's measured capacity (docs/service.md, "Limits per
	// caller").
	DefaultCallerRate = 10000
	// DefaultCallerBurst is each caller's Begin burst: 10,000, one second
	// at the default rate.
	DefaultCallerBurst = 10000
	// DefaultCallerRecords is each caller's stored records: 1,000,000.
	DefaultCallerRecords = 1_000_000
	// DefaultCallerBytes is each caller's stored outcome bytes: 1 GiB.
	DefaultCallerBytes = 1 << 30
	// DefaultMaxRetention is the longest retention a Begin may ask for: 7
	// days.
	DefaultMaxRetention = 7 * 24 * time.Hour
	// DefaultMaxWaiters is how many Begins may wait for in-flight outcomes
	// at once, in all: 10,000.
	DefaultMaxWaiters = 10000
	// DefaultMaxCallerWaiters is how many of them one caller may have: 1,000.
	DefaultMaxCallerWaiters = 1000
	// DefaultCallerOutcomeRate is the outcome bytes each caller's Finishes
	// may carry a second: 32 MiB, 3,000 times the Begin rate's worth of 1 KiB
	// outcomes, yet 32 of the largest (1 MiB) outcomes a second, so no caller
	// can keep the store busy writing (or refusing) megabytes.
	DefaultCallerOutcomeRate = 32 << 20
	// DefaultCallerOutcomeBurst is each caller's outcome byte burst: 32 MiB,
	// one second at the default rate. It is raised to the largest outcome
	// accepted (WithMaxOutcomeBytes) when lower, so every Finish can pass.
	DefaultCallerOutcomeBurst = 32 << 20
)

// WithCallerOutcomeRate limits the outcome bytes each caller's Finishes
// carry to bytesPerSecond with bursts of burst (a token bucket per caller,
// charged the outcome's size), on top of the Finish rate (WithCallerRate).
// Past it Finish answers RESOURCE_EXHAUSTED (DEDUPE_QUOTA_EXCEEDED, quota
// "rate") with RetryInfo before it reads the store or seals the outcome;
// the interceptor retries it within its finish budget. A bytesPerSecond of
// 0 is no limit. Defaults to DefaultCallerOutcomeRate and
// DefaultCallerOutcomeBurst, 32 MiB a second in bursts of 32 MiB.
func WithCallerOutcomeRate(bytesPerSecond float64, burst int) Option {
	return func(o *options) { o.outcomeRate, o.outcomeBurst = bytesPerSecond, burst }
}

// WithResolveOnlySettlesUnknown makes Resolve the only way to settle a
// record marked outcome-unknown (-resolve-admin-only): the late Finish,
// Release or Heartbeat of the attempt that held it, and that attempt's
// re-sent Begin, get RESERVATION_NOT_HELD (Begin: outcome unknown) and leave
// it for an operator; the refused Finish is logged. Defaults to off: the
// holder's late Finish settles the record, a Heartbeat revives it.
func WithResolveOnlySettlesUnknown(on bool) Option {
	return func(o *options) { o.resolveOnly = on }
}

// WithPlaintextOutcomes makes a service with an outcome cipher
// (WithOutcomeCipher) replay stored outcomes without a key id, as stored:
// those written before encryption was turned on. Off, the default, such a
// record answers INTERNAL DEDUPE_OUTCOME_UNREADABLE like one whose key is
// gone: with encryption on, an outcome that is not sealed for its record was
// not written by this service, and replaying it would hand a caller bytes
// anyone with write access to the database planted. Turn it on while
// records written before encryption may live (-max-retention after turning
// it on), then off. Without a cipher every outcome is plaintext and replays.
func WithPlaintextOutcomes(accept bool) Option {
	return func(o *options) { o.plaintextOK = accept }
}

// WithMaxConcurrentBegins bounds the Begins that use the store at once to
// n (n > 0); the others wait for a place within their deadlines, so the
// store's connections stay free for the Heartbeats, Finishes and Releases
// of the calls already running. A crowd of Begins (every caller back at
// once after a store outage, retrying) then cannot keep holders from
// renewing and storing until their leases run out. A Begin whose place
// does not come before its deadline nears (a quarter of what was left, at
// most a second, before it) is answered DEDUPE_STORE_UNAVAILABLE with
// RetryInfo and, on its first try, ErrorInfo metadata reserved=none: it
// sent nothing. Defaults to 0, no bound; the Dedupe service binary sets
// three quarters of its database pool.
func WithMaxConcurrentBegins(n int) Option {
	return func(o *options) { o.maxBegins = max(0, n) }
}

// WithMaxWaiters caps the Begins waiting for in-flight outcomes (max_wait)
// at once: total in all, perCaller for one caller. A Begin past a cap does
// not wait: it answers in_flight at once (the interceptor turns that into
// ABORTED IDEMPOTENCY_IN_FLIGHT with RetryInfo) and counts under
// idemgate_dedupe_quota_exceeded_total{quota="waiters"}. The pool's last
// places (a tenth of total, at most perCaller, at least one) are kept for
// callers holding fewer than a tenth of them each, so callers at their own
// cap cannot fill the pool for a bystander. Waiters of one key share one
// watcher and one store read, so a waiter costs memory, not store load.
// Defaults to 10,000 and 1,000 (1,000 places kept, 100 for each caller).
func WithMaxWaiters(total, perCaller int) Option {
	return func(o *options) { o.maxWaiters, o.maxCallerWaiters = total, perCaller }
}

// WithCallerRate limits each caller (namespace) to perSecond Begins a
// second with bursts of burst, a token bucket per caller
// (golang.org/x/time/rate), and, in a bucket of their own at the same rate,
// as many Finishes: a caller's Finishes follow its Begins, so the Finish
// limit refuses only Finishes no Begin let in (for keys never reserved, say).
// Past either it answers RESOURCE_EXHAUSTED (DEDUPE_QUOTA_EXCEEDED, quota
// "rate") with RetryInfo, before the store is read; the interceptor retries
// a refused Finish within its finish budget. Release, Heartbeat and Resolve
// are not limited: refusing them would strand work already done. A
// perSecond of 0 is no limit. Defaults to DefaultCallerRate, 10,000 a
// second, bursts of DefaultCallerBurst, 10,000.
func WithCallerRate(perSecond float64, burst int) Option {
	return func(o *options) { o.callerRate, o.callerBurst = perSecond, burst }
}

// WithCallerQuota limits what each caller (namespace) keeps stored: records
// (expired ones count until swept) and outcome bytes. A Begin that would
// reserve past either answers RESOURCE_EXHAUSTED (DEDUPE_QUOTA_EXCEEDED,
// quota "records" or "bytes"); duplicates of existing keys are still
// answered. Finish is never refused for the bytes quota (the handler ran):
// an outcome that would take the caller past it is not stored, a
// ResultTooLarge marker is stored in its place (as for an outcome over
// WithMaxOutcomeBytes), so the holder's caller keeps its response and every
// duplicate gets IDEMPOTENCY_RESULT_TOO_LARGE, never a second run. The
// check is against the store's totals (pgstore: as of the last usage
// compaction), so concurrent Finishes may overshoot by what the caller
// finishes in one compaction interval, at most its outcome rate
// (WithCallerOutcomeRate) times the interval plus its burst, per replica.
// 0 is no limit. Defaults to 1,000,000 records and 1 GiB.
func WithCallerQuota(records, bytes int64) Option {
	return func(o *options) { o.callerRecords, o.callerBytes = records, bytes }
}

// WithMaxRetention caps the retention a Begin may ask for; a longer one is
// refused with INVALID_ARGUMENT (DEDUPE_REQUEST_INVALID, field "retention",
// metadata "max_retention"), not clamped: a caller must not believe an
// outcome is replayed for longer than it is. At most MaxRetention. Defaults
// to 7 days.
func WithMaxRetention(d time.Duration) Option {
	return func(o *options) { o.maxRetention = min(d, MaxRetention) }
}

// WithMaxOutcomeBytes sets the largest outcome value Finish and Resolve
// accept; a larger one gets INVALID_ARGUMENT (DEDUPE_OUTCOME_TOO_LARGE) and
// nothing is stored. The interceptor stores a small marker in place of an
// outcome over its own limit, so set both alike. Defaults to 1 MiB.
func WithMaxOutcomeBytes(n int) Option {
	return func(o *options) { o.maxOutcome = n }
}

// Option configures NewServer.
type Option func(*options)

// WithLogger sets the logger for store failures. Defaults to slog.Default().
func WithLogger(logger *slog.Logger) Option {
	return func(o *options) { o.logger = logger }
}

// WithStoreRetryAfter sets the RetryInfo delay sent with
// DEDUPE_STORE_UNAVAILABLE. Defaults to 200ms.
func WithStoreRetryAfter(d time.Duration) Option {
	return func(o *options) { o.storeRetryAfter = d }
}

// WithNotifier sets what wakes a Begin that waits for an in-flight outcome
// (pgstore.Listener for PostgreSQL). Defaults to none: waiters poll.
func WithNotifier(n Notifier) Option {
	return func(o *options) { o.notifier = n }
}

// WithPollInterval sets how often the Begins waiting on one key re-read its
// record, together, when no notification came: one short read per key per
// interval, ten times the interval (jittered) while a Notifier is healthy
// (see Healthy), since polling then only covers a lost notification.
// Defaults to 200ms.
func WithPollInterval(d time.Duration) Option {
	return func(o *options) { o.pollInterval = d }
}

// WithUnknownRetention sets how long an outcome-unknown record is kept, and
// keeps blocking its key, when nobody resolves it. After that it counts as
// absent and the sweeper deletes it with a warning. Defaults to 7 days.
func WithUnknownRetention(d time.Duration) Option {
	return func(o *options) { o.unknownRetention = d }
}

// WithOutcomeCipher seals the outcomes Finish, Resolve and the admin
// ResolveRecord store, and opens them for Begin's replay (see
// OutcomeCipher). Records stored without a key id (before encryption was
// turned on) answer DEDUPE_OUTCOME_UNREADABLE unless WithPlaintextOutcomes
// accepts them. The type URL stays plaintext. Defaults to nil: outcomes are
// stored as received.
func WithOutcomeCipher(c *OutcomeCipher) Option {
	return func(o *options) { o.cipher = c }
}

// WithReplayRecorder makes the service count every replay it serves, per
// record, in r, which adds the counts to the store's records every flush
// (Record.replay_count, last_replayed_at in the admin API). Run r alongside
// the service, and Flush it after the service stopped. Defaults to nil:
// replays are counted per method in the metrics only.
func WithReplayRecorder(r *ReplayRecorder) Option {
	return func(o *options) { o.replays = r }
}

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
}

var defaultOptions = options{
	logger:           slog.Default(),
	storeRetryAfter:  200 * time.Millisecond,
	pollInterval:     200 * time.Millisecond,
	unknownRetention: 7 * 24 * time.Hour,
	maxOutcome:       1 << 20,
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

// WithPollInterval sets how often a waiting Begin re-reads its record when no
// notification came. Each waiter costs one short read per interval and holds
// no database connection in between. Defaults to 200ms.
func WithPollInterval(d time.Duration) Option {
	return func(o *options) { o.pollInterval = d }
}

// WithUnknownRetention sets how long an outcome-unknown record is kept, and
// keeps blocking its key, when nobody resolves it. After that it counts as
// absent and the sweeper deletes it with a warning. Defaults to 7 days.
func WithUnknownRetention(d time.Duration) Option {
	return func(o *options) { o.unknownRetention = d }
}

package dedupesvc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"

	"github.com/idemgate/idemgate/internal/grpcerr"
)

// Quota names: the ErrorInfo metadata "quota" of DEDUPE_QUOTA_EXCEEDED and
// the label of idemgate_dedupe_quota_exceeded_total.
const (
	// QuotaRate: the caller's Begins per second (WithCallerRate).
	QuotaRate = "rate"
	// QuotaRecords: the caller's stored records (WithCallerQuota).
	QuotaRecords = "records"
	// QuotaBytes: the caller's stored outcome bytes (WithCallerQuota).
	QuotaBytes = "bytes"
	// QuotaRetention: a Begin asked for a retention over the service's cap
	// (WithMaxRetention); refused as INVALID_ARGUMENT, counted here too.
	QuotaRetention = "retention"
	// QuotaWaiters: a Begin could not wait for an in-flight outcome because
	// too many Begins wait already (WithMaxWaiters); answered in_flight at
	// once, counted here.
	QuotaWaiters = "waiters"
	// QuotaFinishesInFlight: a Finish arrived while its caller's Finishes
	// already held WithMaxFinishBytesInFlight; refused from its headers.
	QuotaFinishesInFlight = "finish_bytes_in_flight"
)

var allQuotas = []string{QuotaRate, QuotaRecords, QuotaBytes, QuotaRetention, QuotaWaiters, QuotaFinishesInFlight}

// ErrQuotaExceeded is what a *QuotaError matches with errors.Is.
var ErrQuotaExceeded = errors.New("dedupesvc: quota exceeded")

// QuotaError is Store.Begin's refusal to reserve a new key for a namespace at
// its quota (BeginParams.MaxRecords, MaxOutcomeBytes).
type QuotaError struct {
	// Quota is QuotaRecords or QuotaBytes.
	Quota string
	// Limit is the quota; Used what the namespace holds.
	Limit, Used int64
}

// Error implements error.
func (e *QuotaError) Error() string {
	return fmt.Sprintf("dedupesvc: the namespace holds %d %s, at its quota of %d", e.Used, e.Quota, e.Limit)
}

// Is makes errors.Is(err, ErrQuotaExceeded) hold.
func (e *QuotaError) Is(target error) bool { return target == ErrQuotaExceeded }

// CheckQuota returns a *QuotaError when a namespace using records and bytes
// may not reserve: a new key (newRecord) needs records under p.MaxRecords;
// any reservation needs bytes under p.MaxOutcomeBytes, since its outcome
// will add to them. A zero limit is no limit.
func CheckQuota(p BeginParams, newRecord bool, records, bytes int64) error {
	if newRecord && p.MaxRecords > 0 && records >= p.MaxRecords {
		return &QuotaError{Quota: QuotaRecords, Limit: p.MaxRecords, Used: records}
	}
	if p.MaxOutcomeBytes > 0 && bytes >= p.MaxOutcomeBytes {
		return &QuotaError{Quota: QuotaBytes, Limit: p.MaxOutcomeBytes, Used: bytes}
	}
	return nil
}

// quotaExceeded is the status a caller over a quota gets: RESOURCE_EXHAUSTED
// with DEDUPE_QUOTA_EXCEEDED naming the quota and its limit, and RetryInfo
// when waiting retryAfter helps.
func quotaExceeded(quota, limit, message string, retryAfter time.Duration) error {
	return grpcerr.New(codes.ResourceExhausted, ReasonQuotaExceeded, message,
		map[string]string{"quota": quota, "limit": limit}, retryAfter)
}

// maxLimiters bounds the per-caller rate limiters kept; past it, those of
// callers idle long enough to have a full bucket are dropped (they would
// start full anyway).
const maxLimiters = 10000

// rateLimiters is one token bucket per namespace.
type rateLimiters struct {
	limit rate.Limit
	burst int
	mu    sync.Mutex
	m     map[string]*rate.Limiter
}

// allow takes n tokens for ns, or returns how long until they are free.
func (l *rateLimiters) allow(ns string, n int) (time.Duration, bool) {
	if l.limit <= 0 {
		return 0, true
	}
	now := time.Now()
	lim := l.limiter(ns, now)
	if lim.AllowN(now, n) {
		return 0, true
	}
	return refusedFor(lim, now, n), false
}

// take is allow that can be undone: when it takes the tokens, refund puts
// them back (as far as the bucket's later takers let it: see
// rate.Reservation.CancelAt). refund is never nil.
func (l *rateLimiters) take(ns string, n int) (refund func(), wait time.Duration, ok bool) {
	if l.limit <= 0 {
		return func() {}, 0, true
	}
	now := time.Now()
	lim := l.limiter(ns, now)
	r := lim.ReserveN(now, n)
	if r.OK() && r.DelayFrom(now) == 0 {
		return func() { r.CancelAt(now) }, 0, true
	}
	r.CancelAt(now)
	return func() {}, refusedFor(lim, now, n), false
}

// refusedFor is how long until lim holds n tokens, as of now.
func refusedFor(lim *rate.Limiter, now time.Time, n int) time.Duration {
	r := lim.ReserveN(now, n)
	defer r.CancelAt(now)
	if !r.OK() {
		return time.Second
	}
	return max(r.DelayFrom(now), time.Millisecond)
}

// limiter is ns's bucket, made (full) on first use. The map's lock is held
// for the lookup only; the bucket has its own.
func (l *rateLimiters) limiter(ns string, now time.Time) *rate.Limiter {
	l.mu.Lock()
	lim, ok := l.m[ns]
	if !ok {
		if l.m == nil {
			l.m = map[string]*rate.Limiter{}
		}
		if len(l.m) >= maxLimiters {
			for k, v := range l.m {
				if v.TokensAt(now) >= float64(l.burst) {
					delete(l.m, k)
				}
			}
		}
		lim = rate.NewLimiter(l.limit, l.burst)
		l.m[ns] = lim
	}
	l.mu.Unlock()
	return lim
}

// holds reports whether ns's bucket holds n tokens now, without taking
// any, or how long until it will.
func (l *rateLimiters) holds(ns string, n int) (time.Duration, bool) {
	if l.limit <= 0 {
		return 0, true
	}
	now := time.Now()
	l.mu.Lock()
	lim, ok := l.m[ns]
	l.mu.Unlock()
	if !ok {
		return 0, true // a caller not seen yet starts with a full bucket
	}
	tokens := lim.TokensAt(now)
	if tokens >= float64(n) {
		return 0, true
	}
	return max(time.Duration((float64(n)-tokens)/float64(l.limit)*float64(time.Second)), time.Millisecond), false
}

// rateKey names the Begin rate bucket of ctx's caller: its namespace, or,
// for an agent a tool server forwarded (Caller.Agent), the pair, which no
// namespace can spell (a namespace has no control character).
func rateKey(ctx context.Context, ns string) string {
	if c, _ := CallerFromContext(ctx); c.Agent != "" {
		return ns + "\x00" + c.Agent
	}
	return ns
}

// formatRate writes a rate limit for ErrorInfo metadata.
func formatRate(l rate.Limit) string { return strconv.FormatFloat(float64(l), 'g', -1, 64) + "/s" }

// UsageCompactor is a Store whose usage totals trail its writes until
// compacted (pgstore: the triggers append changes, and compaction adds them
// up off the reserving transaction, so no Begin waits on a shared counter;
// a Begin adds the changes not yet compacted to the totals, and Finish's
// bytes check reads the totals alone). Run
// RunUsageCompaction beside every Dedupe service on such a store.
type UsageCompactor interface {
	// CompactUsage adds the changes recorded since the last compaction to
	// the totals and returns how many it moved. Safe to call from several
	// replicas at once: one compacts, the others move nothing.
	CompactUsage(ctx context.Context) (int64, error)
}

// UsageLagCompactor is a UsageCompactor that also tells how far its totals
// trail the writes (pgstore). RunUsageCompactionWith sets
// idemgate_usage_compaction_lag_seconds from it.
type UsageLagCompactor interface {
	UsageCompactor
	// CompactUsageLag compacts as CompactUsage does and also returns the
	// age of the oldest change that waited when it began: 0 when none did.
	CompactUsageLag(ctx context.Context) (moved int64, lag time.Duration, err error)
}

// DefaultUsageCompactionInterval is how often RunUsageCompaction compacts
// by default. A Begin counts the changes not yet compacted too (pgstore:
// MaxQuotaOvershoot bounds what it misses), so this bounds how many it
// reads, and the totals' lag behind the rows, not the records quota's
// overshoot.
const DefaultUsageCompactionInterval = time.Second

// RunUsageCompaction compacts c's usage every interval (at least 10ms;
// DefaultUsageCompactionInterval when 0) until ctx ends, logging a failure
// once per run of failures and the recovery after it. It is
// RunUsageCompactionWith without metrics.
func RunUsageCompaction(ctx context.Context, c UsageCompactor, interval time.Duration, logger *slog.Logger) {
	RunUsageCompactionWith(ctx, c, UsageCompactionConfig{Interval: interval, Logger: logger})
}

// UsageCompactionConfig configures RunUsageCompactionWith.
type UsageCompactionConfig struct {
	// Interval is how often to compact, at least 10ms. Defaults to
	// DefaultUsageCompactionInterval.
	Interval time.Duration
	// Logger gets a failure once per run of failures and the recovery
	// after it. Defaults to discarding them.
	Logger *slog.Logger
	// Metrics gets the compaction lag after every round when the store is
	// a UsageLagCompactor (idemgate_usage_compaction_lag_seconds). Defaults
	// to none.
	Metrics *Metrics
}

// RunUsageCompactionWith compacts c's usage every cfg.Interval until ctx
// ends, as RunUsageCompaction does, and sets cfg.Metrics' compaction lag to
// what each round that reached the store measured: about the interval when
// compaction keeps up, growing round by round while it fails with the store
// reachable. A round that cannot reach the store leaves it as it was.
func RunUsageCompactionWith(ctx context.Context, c UsageCompactor, cfg UsageCompactionConfig) {
	interval := cfg.Interval
	if interval == 0 {
		interval = DefaultUsageCompactionInterval
	}
	interval = max(interval, 10*time.Millisecond)
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	lagger, _ := c.(UsageLagCompactor)
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Generous: a backlog left by a long failure is moved in one
		// transaction, and one cut short by its timeout would roll back and
		// leave the backlog to grow.
		callCtx, cancel := context.WithTimeout(ctx, max(interval, time.Minute))
		var err error
		if lagger != nil {
			var lag time.Duration
			_, lag, err = lagger.CompactUsageLag(callCtx)
			if cfg.Metrics != nil && (err == nil || lag > 0) {
				cfg.Metrics.usageLag.Set(lag.Seconds())
			}
		} else {
			_, err = c.CompactUsage(callCtx)
		}
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil && !failing:
			failing = true
			logger.Warn("compacting quota usage failed; the quotas see usage as of the last compaction until it succeeds",
				slog.Any("error", err))
		case err == nil && failing:
			failing = false
			logger.Info("compacting quota usage works again")
		}
	}
}

package dedupesvc

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// ReplayCounter is a Store that keeps, per record, how many replays of its
// outcome were served and when the last one was (both bundled stores are).
// Begin stays read-only on a replay: the service counts replays in memory
// (ReplayRecorder) and adds them in one batched statement per flush.
type ReplayCounter interface {
	// AddReplays adds each count to its record, in one statement, and
	// returns how many records it changed. A count whose record is gone, no
	// longer completed, or completed at another time than CompletedAt (its
	// key expired and was used anew) is dropped: it belongs to an outcome
	// that no longer exists.
	AddReplays(ctx context.Context, counts []ReplayCount) (int, error)
}

// ReplayCount is what one replica counted for one record between two
// flushes.
type ReplayCount struct {
	// ID is the record.
	ID RecordID
	// CompletedAt is the completion time of the outcome that was replayed,
	// as Begin answered it: it tells this outcome from a later one of the
	// same key.
	CompletedAt time.Time
	// Count is how many replays were served.
	Count int64
	// Since is how long before the AddReplays call the last of them was
	// served, measured on this process's monotonic clock, so the store
	// dates it on its own clock (now minus Since) whatever the skew between
	// replicas and the database.
	Since time.Duration
}

// ReplayRecorderConfig configures a ReplayRecorder. Zero fields take their
// defaults.
type ReplayRecorderConfig struct {
	// Interval is how often counts are flushed to the store. Defaults to
	// DefaultReplayFlushInterval (1s).
	Interval time.Duration
	// MaxRecords bounds the records counted between two flushes, so a flood
	// of replays of distinct keys cannot grow memory without limit: a replay
	// of a record past it is not counted (the count stays a lower bound;
	// idemgate_dedupe_replay_counts_dropped_total counts it) and the next
	// flush starts at once. Defaults to DefaultReplayMaxRecords (10,000).
	MaxRecords int
	// Timeout bounds one flush's statement. Defaults to 10s.
	Timeout time.Duration
	// Logger receives failed flushes. Defaults to slog.Default().
	Logger *slog.Logger
	// Metrics, when set, counts replays that could not be recorded.
	// Defaults to nil.
	Metrics *Metrics
}

// Defaults of ReplayRecorderConfig.
const (
	// DefaultReplayFlushInterval is how often replay counts are flushed: 1s.
	DefaultReplayFlushInterval = time.Second
	// DefaultReplayMaxRecords is how many records' counts wait for one
	// flush at most: 10,000.
	DefaultReplayMaxRecords = 10000
)

// ReplayRecorder counts the replays the Dedupe service serves, per record,
// in memory, and adds them to the store (a ReplayCounter) in one batched
// statement per flush, so a replay never writes on Begin's path. The counts
// are a lower bound: counts not yet flushed are lost when the process dies,
// a flush that fails is not retried (retrying a statement whose commit was
// merely unacknowledged could count twice), and replays past MaxRecords are
// not counted. Install it with WithReplayRecorder and run it with Run.
type ReplayRecorder struct {
	store ReplayCounter
	cfg   ReplayRecorderConfig
	kick  chan struct{} // a flush is due before the interval: the map is full

	mu      sync.Mutex
	pending map[replayKey]*replayEntry

	flushMu sync.Mutex // one flush at a time: Run's, and Flush at shutdown
}

type replayKey struct {
	id        RecordID
	completed int64 // CompletedAt in Unix nanoseconds: time.Time is not a safe map key
}

type replayEntry struct {
	completedAt time.Time
	count       int64
	last        time.Time // with its monotonic reading
}

// NewReplayRecorder returns a recorder that flushes to store.
func NewReplayRecorder(store ReplayCounter, cfg ReplayRecorderConfig) *ReplayRecorder {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultReplayFlushInterval
	}
	if cfg.MaxRecords <= 0 {
		cfg.MaxRecords = DefaultReplayMaxRecords
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &ReplayRecorder{store: store, cfg: cfg, kick: make(chan struct{}, 1), pending: map[replayKey]*replayEntry{}}
}

// Record counts one replay of record id's outcome completed at completedAt.
func (r *ReplayRecorder) Record(id RecordID, completedAt time.Time) {
	now := time.Now()
	k := replayKey{id: id, completed: completedAt.UnixNano()}
	r.mu.Lock()
	e, ok := r.pending[k]
	if !ok {
		if len(r.pending) >= r.cfg.MaxRecords {
			r.mu.Unlock()
			r.cfg.Metrics.replayCountsDropped(1)
			select {
			case r.kick <- struct{}{}:
			default:
			}
			return
		}
		e = &replayEntry{completedAt: completedAt}
		r.pending[k] = e
	}
	e.count++
	e.last = now
	r.mu.Unlock()
}

// Pending returns how many records have counts waiting for the next flush.
func (r *ReplayRecorder) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending)
}

// Run flushes every Interval (and at once when MaxRecords is reached) until
// ctx is done. Call Flush after the last replay was served (at shutdown) to
// store what counted since the last flush.
func (r *ReplayRecorder) Run(ctx context.Context) {
	ticker := time.NewTicker(r.cfg.Interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-r.kick:
		}
		if err := r.Flush(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.WarnContext(ctx, "flushing replay counts failed; they are dropped (replay counts are a lower bound)", slog.Any("error", err))
		}
	}
}

// Flush adds the counts since the last flush to the store, in one
// statement, and forgets them whatever the outcome: a failed flush's counts
// are dropped (and counted in idemgate_dedupe_replay_counts_dropped_total).
func (r *ReplayRecorder) Flush(ctx context.Context) error {
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	r.mu.Lock()
	batch := r.pending
	if len(batch) == 0 {
		r.mu.Unlock()
		return nil
	}
	r.pending = make(map[replayKey]*replayEntry, len(batch))
	r.mu.Unlock()
	now := time.Now()
	counts := make([]ReplayCount, 0, len(batch))
	var total int64
	for k, e := range batch {
		counts = append(counts, ReplayCount{ID: k.id, CompletedAt: e.completedAt, Count: e.count, Since: max(now.Sub(e.last), 0)})
		total += e.count
	}
	fctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	if _, err := r.store.AddReplays(fctx, counts); err != nil {
		r.cfg.Metrics.replayCountsDropped(total)
		return err
	}
	return nil
}

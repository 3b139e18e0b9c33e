package dedupesvc

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// SweeperConfig configures a Sweeper. Zero fields take their defaults.
type SweeperConfig struct {
	// Interval is the pause between sweeps. Defaults to 1m.
	Interval time.Duration
	// BatchSize is how many expired records one statement deletes, so no
	// sweep holds many row locks or a long transaction. Defaults to 1000.
	BatchSize int
	// MaxBatches bounds the batches of one sweep, so a backlog is worked off
	// over several sweeps instead of monopolising the store. Defaults to 100.
	MaxBatches int
	// Logger receives one line per sweep that deleted something, a warning
	// for every outcome-unknown record deleted unresolved, and store errors.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// LostOutcomeMarker is a Store whose sweeper also marks lost outcomes (both
// bundled stores are one). A FAIL_CLOSED holder that died leaves its record
// in flight; Begin and Resolve already treat it as outcome-unknown once its
// lease ran out, but an operator's listing and the unknown-records gauge
// count only records marked so, and without a Begin nobody would mark it.
type LostOutcomeMarker interface {
	// MarkLostOutcomes marks outcome-unknown up to limit in-flight records
	// of FAIL_CLOSED holders whose effective lease (the resume grace
	// included) ended one full lease ago, as a FAIL_CLOSED Begin would at
	// its end, kept for their unknown retention past that lease's end, and
	// returns how many it marked. The extra lease lets a holder that lost
	// its renewals for a moment come back before operators see it listed.
	// The holder's Heartbeat or Finish still revives or settles such a
	// record.
	MarkLostOutcomes(ctx context.Context, limit int) (int, error)
}

// Sweeper deletes expired records in bounded batches, so the table stays the
// size of the retention window. Expired records already count as absent to
// Begin; sweeping only reclaims their space. An outcome-unknown record, and
// the in-flight record of a FAIL_CLOSED holder that died, expires only after
// the unknown retention (see WithUnknownRetention), and each one deleted
// unresolved is logged. Each sweep first marks such dead holders' records
// outcome-unknown (LostOutcomeMarker), so operators see them.
type Sweeper struct {
	store Store
	cfg   SweeperConfig
}

// NewSweeper returns a Sweeper over store.
func NewSweeper(store Store, cfg SweeperConfig) *Sweeper {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 1000
	}
	if cfg.MaxBatches <= 0 {
		cfg.MaxBatches = 100
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Sweeper{store: store, cfg: cfg}
}

// Run sweeps every Interval until ctx is done. Store errors are logged and the
// next sweep tries again.
func (s *Sweeper) Run(ctx context.Context) {
	ticker := time.NewTicker(s.cfg.Interval)
	defer ticker.Stop()
	for {
		if _, err := s.SweepOnce(ctx); err != nil && ctx.Err() == nil {
			s.cfg.Logger.ErrorContext(ctx, "sweeping expired records failed", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// SweepOnce marks lost outcomes when the store is a LostOutcomeMarker, then
// deletes expired records, each batch by batch until a batch comes back
// short or MaxBatches ran, and returns how many it deleted. A failed mark
// is logged and does not stop the deletion: the error returned joins both.
func (s *Sweeper) SweepOnce(ctx context.Context) (int, error) {
	var markErr error
	if m, ok := s.store.(LostOutcomeMarker); ok {
		marked := 0
		for range s.cfg.MaxBatches {
			n, err := m.MarkLostOutcomes(ctx, s.cfg.BatchSize)
			marked += n
			if err != nil {
				markErr = err
				s.cfg.Logger.ErrorContext(ctx, "marking lost outcomes failed; deleting expired records anyway", slog.Any("error", err))
				break
			}
			if n < s.cfg.BatchSize {
				break
			}
		}
		if marked > 0 {
			// Another replica's holder may be alive but cut off from the
			// store: resolving its record would fence it.
			s.cfg.Logger.WarnContext(ctx, "marked outcome-unknown the records of FAIL_CLOSED holders whose lease ran out a lease ago with no outcome; resolve each after confirming its holder is gone (no tool server still runs it): idemctl list -state unknown",
				slog.Int("marked", marked))
		}
	}
	total := 0
	for range s.cfg.MaxBatches {
		n, unknown, err := s.store.DeleteExpired(ctx, s.cfg.BatchSize)
		total += n
		for _, id := range unknown {
			s.cfg.Logger.WarnContext(ctx, "deleted an outcome-unknown record nobody resolved within its limit; its side effect may or may not have happened",
				slog.String("scope", id.Scope), slog.String("key", id.Key))
		}
		if err != nil {
			return total, errors.Join(markErr, err)
		}
		if n < s.cfg.BatchSize {
			break
		}
	}
	if total > 0 {
		s.cfg.Logger.InfoContext(ctx, "swept expired records", slog.Int("deleted", total))
	}
	return total, markErr
}

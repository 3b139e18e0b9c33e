package dedupesvc

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultUnknownCountInterval is how often UnknownRecords counts the
// outcome-unknown records unless UnknownRecordsConfig says otherwise.
const DefaultUnknownCountInterval = time.Minute

// MaxUnknownCounted bounds one count: past it the gauge is a lower bound
// (and a warning is logged), so a flood of lost outcomes cannot turn the
// count into a table scan every interval.
const MaxUnknownCounted = 100_000

// UnknownRecordsConfig configures UnknownRecords.
type UnknownRecordsConfig struct {
	// Interval is how often the records are counted. Defaults to
	// DefaultUnknownCountInterval.
	Interval time.Duration
	// Logger receives count failures. Defaults to slog.Default().
	Logger *slog.Logger
}

// UnknownRecords exports idemgate_records_outcome_unknown, how many
// outcome-unknown records wait for an operator: the action behind each may or
// may not have happened, and its key stays blocked until someone resolves
// it. Counting the records in the store, rather than the calls that hit
// one, lets an alert fire while nobody retries. The store is asked every
// Interval (ListRecords with state unknown: on PostgreSQL a scan of the
// partial index on unknown rows), never at scrape time; the gauge is absent
// until the first count.
type UnknownRecords struct {
	inspector Inspector
	cfg       UnknownRecordsConfig
	desc      *prometheus.Desc

	mu      sync.Mutex
	count   int
	counted bool
}

var _ prometheus.Collector = (*UnknownRecords)(nil)

// NewUnknownRecords returns the collector over inspector; register it with
// a prometheus.Registerer and start Run.
func NewUnknownRecords(inspector Inspector, cfg UnknownRecordsConfig) *UnknownRecords {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultUnknownCountInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &UnknownRecords{
		inspector: inspector,
		cfg:       cfg,
		desc: prometheus.NewDesc("idemgate_records_outcome_unknown",
			"Outcome-unknown records waiting for an operator to resolve them (idemctl list -state unknown), counted every interval; at most MaxUnknownCounted.",
			nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (u *UnknownRecords) Describe(ch chan<- *prometheus.Desc) { ch <- u.desc }

// Collect implements prometheus.Collector with the last count.
func (u *UnknownRecords) Collect(ch chan<- prometheus.Metric) {
	u.mu.Lock()
	count, counted := u.count, u.counted
	u.mu.Unlock()
	if counted {
		ch <- prometheus.MustNewConstMetric(u.desc, prometheus.GaugeValue, float64(count))
	}
}

// Run counts at once and then every Interval until ctx ends.
func (u *UnknownRecords) Run(ctx context.Context) {
	ticker := time.NewTicker(u.cfg.Interval)
	defer ticker.Stop()
	for {
		if _, err := u.CountOnce(ctx); err != nil && ctx.Err() == nil {
			u.cfg.Logger.ErrorContext(ctx, "counting outcome-unknown records failed; idemgate_records_outcome_unknown keeps its last value", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// CountOnce counts the outcome-unknown records page by page, sets the gauge
// and returns the count.
func (u *UnknownRecords) CountOnce(ctx context.Context) (int, error) {
	const page = 1000
	count := 0
	q := ListQuery{State: StateUnknown, Limit: page}
	for count < MaxUnknownCounted {
		records, err := u.inspector.ListRecords(ctx, q)
		if err != nil {
			return count, err
		}
		count += len(records)
		if len(records) < page {
			break
		}
		last := records[len(records)-1]
		pos := PositionOf(last)
		q.After = &pos
	}
	if count >= MaxUnknownCounted {
		u.cfg.Logger.WarnContext(ctx, "more outcome-unknown records than MaxUnknownCounted: idemgate_records_outcome_unknown is a lower bound", slog.Int("counted", count))
	}
	u.mu.Lock()
	u.count, u.counted = count, true
	u.mu.Unlock()
	return count, nil
}

package dedupeapp

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// poolCollector exports a pgxpool's statistics, read at each scrape, so an
// operator sees callers queueing for connections (empty acquires and their
// wait time growing) before latency tells them.
type poolCollector struct {
	pool *pgxpool.Pool

	acquires, acquireSeconds, canceledAcquires, emptyAcquires, emptyWaitSeconds, newConns *prometheus.Desc
	acquired, idle, constructing, total, max                                              *prometheus.Desc
}

func newPoolCollector(pool *pgxpool.Pool) *poolCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("idemgate_db_pool_"+name, help, nil, nil)
	}
	return &poolCollector{
		pool:             pool,
		acquires:         d("acquires_total", "Connections acquired from the pool."),
		acquireSeconds:   d("acquire_seconds_total", "Total time spent acquiring connections, waits included."),
		canceledAcquires: d("canceled_acquires_total", "Acquires whose context ended before a connection was free."),
		emptyAcquires:    d("empty_acquires_total", "Acquires that found no idle connection and waited for one (or for a new one)."),
		emptyWaitSeconds: d("empty_acquire_wait_seconds_total", "Total time acquires waited because no connection was idle: the queue for connections."),
		newConns:         d("new_connections_total", "Connections the pool opened."),
		acquired:         d("acquired_connections", "Connections currently in use."),
		idle:             d("idle_connections", "Connections currently idle."),
		constructing:     d("constructing_connections", "Connections currently being opened."),
		total:            d("total_connections", "Connections open or being opened."),
		max:              d("max_connections", "The pool's size (-db-max-conns)."),
	}
}

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.acquires, c.acquireSeconds, c.canceledAcquires, c.emptyAcquires, c.emptyWaitSeconds, c.newConns,
		c.acquired, c.idle, c.constructing, c.total, c.max} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge := func(d *prometheus.Desc, v int32) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter(c.acquires, float64(s.AcquireCount()))
	counter(c.acquireSeconds, s.AcquireDuration().Seconds())
	counter(c.canceledAcquires, float64(s.CanceledAcquireCount()))
	counter(c.emptyAcquires, float64(s.EmptyAcquireCount()))
	counter(c.emptyWaitSeconds, s.EmptyAcquireWaitTime().Seconds())
	counter(c.newConns, float64(s.NewConnsCount()))
	gauge(c.acquired, s.AcquiredConns())
	gauge(c.idle, s.IdleConns())
	gauge(c.constructing, s.ConstructingConns())
	gauge(c.total, s.TotalConns())
	gauge(c.max, s.MaxConns())
}

// awayStats is a store that counts its tries of a database it could not
// reach (pgstore.Store.AwayStats).
type awayStats interface {
	AwayStats() (failedMarks, pacedCalls int64)
}

// awayCollector exports a store's awayStats, read at each scrape: how often
// the replica tried PostgreSQL while it was away, and how many calls the
// backoff between tries failed at once.
type awayCollector struct {
	store        awayStats
	tries, paced *prometheus.Desc
}

func newAwayCollector(store awayStats) *awayCollector {
	return &awayCollector{
		store: store,
		tries: prometheus.NewDesc("idemgate_db_unreachable_tries_total",
			"Tries to reach PostgreSQL again (to mark the store resumed, each a connection attempt) that failed while it was away: at most about two a second.", nil, nil),
		paced: prometheus.NewDesc("idemgate_db_paced_calls_total",
			"Store operations failed at once, with the last try's error and without connecting, because PostgreSQL was away and the backoff since that try had not run out.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *awayCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tries
	ch <- c.paced
}

// Collect implements prometheus.Collector.
func (c *awayCollector) Collect(ch chan<- prometheus.Metric) {
	tries, paced := c.store.AwayStats()
	ch <- prometheus.MustNewConstMetric(c.tries, prometheus.CounterValue, float64(tries))
	ch <- prometheus.MustNewConstMetric(c.paced, prometheus.CounterValue, float64(paced))
}

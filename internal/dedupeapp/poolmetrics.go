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

package console

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// healthTimeout bounds the overview's store health check: a store that
// does not answer within it is shown as not answering, and the page
// still renders.
const healthTimeout = 2 * time.Second

// StoreHealth is what the overview shows of the store's health: only what
// the service itself can see from its connections.
type StoreHealth struct {
	// Store names the store and where it is ("PostgreSQL at host:port").
	Store string
	// OK is set when the store answered the check.
	OK bool
	// Detail says what the check found (the server's version, primary or
	// standby) or, when not OK, what went wrong.
	Detail string
	// Nodes are a distributed store's nodes (Citus workers), each checked.
	Nodes []NodeHealth
}

// NodeHealth is one node of a distributed store.
type NodeHealth struct {
	// Name is the node's host:port as the coordinator knows it.
	Name string
	// OK is set when the node answered; Detail says what it answered.
	OK     bool
	Detail string
}

// healthRow is StoreHealth as the overview shows it.
type healthRow struct {
	StoreHealth
	Took string
}

// storeHealth runs Config.Health bounded by healthTimeout; nil without one.
func (c *Console) storeHealth(ctx context.Context) *healthRow {
	if c.cfg.Health == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	start := time.Now()
	h := c.cfg.Health(ctx)
	return &healthRow{StoreHealth: h, Took: age(time.Since(start))}
}

// PostgresHealth asks the server pool reaches whether it is a primary, and
// with citus each worker its coordinator knows of whether it answers
// (run_command_on_workers): what Config.Health returns for a PostgreSQL
// store.
func PostgresHealth(ctx context.Context, pool *pgxpool.Pool, citus bool) StoreHealth {
	h := StoreHealth{Store: "PostgreSQL"}
	var (
		standby       bool
		version, addr string
	)
	err := pool.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('server_version'),
	    coalesce(host(inet_server_addr()) || ':' || inet_server_port(), 'a Unix socket')`).Scan(&standby, &version, &addr)
	if err != nil {
		h.Detail = "the check failed: " + err.Error() + "; Begin and Finish fail the same way until it answers: check the server and the network to it"
		return h
	}
	h.Store = "PostgreSQL " + version + " at " + addr
	// Behind Patroni (target_session_attrs=read-write) the primary is its
	// leader; the service sees only the server it reached.
	h.OK, h.Detail = true, "the primary (read-write), as the service reached it: behind Patroni, its leader"
	if standby {
		h.OK, h.Detail = false, "a standby (read-only): every write fails; point -database-url at the primary (with Patroni: target_session_attrs=read-write over every member)"
	}
	if !citus {
		return h
	}
	h.Store = "Citus coordinator, " + h.Store
	rows, err := pool.Query(ctx, `SELECT nodename || ':' || nodeport, success, result FROM run_command_on_workers('SELECT 1') ORDER BY 1`)
	if err == nil {
		h.Nodes, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (NodeHealth, error) {
			var n NodeHealth
			var result string
			err := row.Scan(&n.Name, &n.OK, &result)
			n.Detail = "worker: answered"
			if !n.OK {
				n.Detail = "worker: " + result + "; calls whose keys live on it fail until it answers"
			}
			return n, err
		})
	}
	if err != nil {
		h.OK, h.Detail = false, "listing the Citus workers failed: "+err.Error()
	}
	return h
}

package pgstore

import (
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// CancelGrace is how long a statement whose caller's context ended may
// still take to answer before its connection is closed (KeepConnsOnCancel):
// 1s, far above a statement's time on a database that is up, so only a
// database that stopped answering costs the connection.
const CancelGrace = time.Second

// KeepConnsOnCancel makes the connections of cfg outlive a caller that gives
// up mid-statement: the statement runs on and its connection returns to the
// pool when the answer comes within CancelGrace; later the connection is
// closed, as pgx closes it at once by default. Callers give up together
// when a loaded store slows, and after a store's return, when every waiting
// caller's deadline runs out at once: each close then cost a new
// connection, on Citus a coordinator backend and its connections to the
// workers, which slowed the store further (issue 38 item 3: new connections
// a second rose from 0 to 23 and the pool stayed exhausted for 30s).
// dedupesvc's pool has it (internal/dedupeapp.OpenPool); give it to a pool
// made for New. The statement's caller still returns when its context ends
// only once the answer or the grace came: a pool Acquire is not held back.
func KeepConnsOnCancel(cfg *pgconn.Config) {
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn(), DeadlineDelay: CancelGrace}
	}
}

// closeOnCancel is pgx's default: a connection whose caller gives up is
// closed at once (the Listener's, whose waits end only at shutdown).
func closeOnCancel(c *pgconn.PgConn) ctxwatch.Handler {
	return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
}

package pgstore

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgxlisten"

	"github.com/idemgate/idemgate/dedupesvc"
)

// Listener turns the Store's NOTIFY announcements into wake-ups for waiting
// duplicates (dedupesvc.Notifier). It holds one connection per dedupe service
// replica, however many calls wait, and reconnects after failures; a
// notification lost meanwhile only delays a waiter until its next poll.
type Listener struct {
	listener *pgxlisten.Listener
	pool     *pgxpool.Pool
	logger   *slog.Logger

	waiters dedupesvc.Waiters[string] // by NotifyID
	// healthy is set once a connection is made and cleared when listening
	// fails, so the service polls often only while notifications may be lost.
	healthy atomic.Bool
}

var _ dedupesvc.Healthy = (*Listener)(nil)

// Healthy implements dedupesvc.Healthy: the Listener holds a connection and
// no error was reported since it connected.
func (l *Listener) Healthy() bool { return l.healthy.Load() }

var _ dedupesvc.Notifier = (*Listener)(nil)

// NewListener returns a Listener on channel (DefaultChannel unless the Store
// was given another) that connects like pool. Run starts it.
func NewListener(pool *pgxpool.Pool, channel string, logger *slog.Logger) *Listener {
	l := &Listener{pool: pool, logger: logger}
	connConfig := pool.Config().ConnConfig
	l.listener = &pgxlisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			conn, err := pgx.ConnectConfig(ctx, connConfig.Copy())
			l.healthy.Store(err == nil)
			return conn, err
		},
		LogError: func(ctx context.Context, err error) {
			l.healthy.Store(false)
			if ctx.Err() == nil {
				logger.WarnContext(ctx, "listening for record changes failed; waiters poll until it reconnects", slog.Any("error", err))
			}
		},
		ReconnectDelay: 2 * time.Second,
	}
	l.listener.Handle(channel, pgxlisten.HandlerFunc(func(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
		l.waiters.Wake(n.Payload)
		return nil
	}))
	return l
}

// Run listens until ctx is done.
func (l *Listener) Run(ctx context.Context) {
	_ = l.listener.Listen(ctx) // returns only with ctx's error
}

// watchSQL asks for a NOTIFY when the in-flight record settles. When the
// record is no longer in flight it changes nothing, and the subscriber is
// woken at once to read what it became.
const watchSQL = `
UPDATE idemgate_records SET waiters = true
WHERE namespace = $3 AND scope = $1 AND idempotency_key = $2 AND state = 'in_flight'`

// Subscribe implements dedupesvc.Notifier. It flags the record as waited for,
// so the change that settles it sends a NOTIFY; if that fails the waiter
// still polls.
func (l *Listener) Subscribe(ctx context.Context, rid dedupesvc.RecordID) (<-chan struct{}, func()) {
	id := NotifyID(rid)
	ch, unsubscribe := l.waiters.Add(id)
	tag, err := l.pool.Exec(ctx, watchSQL, rid.Scope, rid.Key, rid.Namespace)
	switch {
	case err != nil:
		l.logger.WarnContext(ctx, "could not ask for a notification; the waiter polls", slog.Any("error", err))
	case tag.RowsAffected() == 0:
		l.waiters.Wake(id)
	}
	return ch, unsubscribe
}

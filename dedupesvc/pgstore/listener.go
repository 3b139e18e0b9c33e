package pgstore

import (
	"context"
	"crypto/rand"
	"log/slog"
	"strings"
	"sync"
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
//
// Its connection must be a session of its own: behind a PgBouncer in
// transaction pooling mode the LISTEN holds only for the statement, and no
// notification arrives. So after each LISTEN it sends itself a probe
// through the pool, the way the Store announces changes, and reports itself
// Healthy only once the probe arrives; while it does not, it warns and the
// service polls at its full rate. ListenOn gives it a direct connection.
type Listener struct {
	listener *pgxlisten.Listener
	pool     *pgxpool.Pool
	channel  string
	logger   *slog.Logger
	// connConfig is what the Listener connects with: the pool's unless
	// ListenOn says otherwise.
	connConfig *pgx.ConnConfig
	// probeEvery is how long a probe may take before the Listener warns
	// and sends another.
	probeEvery time.Duration

	waiters dedupesvc.Waiters[string] // by NotifyID
	// probe is the payload of the probe the current connection awaits, nil
	// once it arrived or while there is no connection.
	probe atomic.Pointer[string]
	// healthy is set once the current connection received its probe and
	// cleared when listening fails, so the service polls often only while
	// notifications may be lost.
	healthy atomic.Bool
	// probes are the awaitProbe goroutines, waited for by Run.
	probes sync.WaitGroup
}

// probePrefix starts a probe's payload; a record's NotifyID is hex, so
// never one.
const probePrefix = "probe:"

// defaultProbeEvery is Listener.probeEvery unless a test sets it: long
// enough for a NOTIFY on a loaded database, short enough that an operator
// sees the warning at start.
const defaultProbeEvery = 10 * time.Second

var _ dedupesvc.Healthy = (*Listener)(nil)

// Healthy implements dedupesvc.Healthy: the Listener holds a connection,
// a notification sent through the pool since it connected arrived on it,
// and no error was reported since.
func (l *Listener) Healthy() bool { return l.healthy.Load() }

var _ dedupesvc.Notifier = (*Listener)(nil)

// ListenerOption configures NewListener.
type ListenerOption func(*Listener)

// ListenOn makes the Listener connect with cfg instead of like its pool:
// a direct connection to PostgreSQL when the pool goes through a
// transaction-pooling PgBouncer (dedupesvc -listen-database-url). Defaults
// to the pool's connection config.
func ListenOn(cfg *pgx.ConnConfig) ListenerOption {
	return func(l *Listener) { l.connConfig = cfg }
}

// NewListener returns a Listener on channel (DefaultChannel unless the Store
// was given another) that connects like pool unless ListenOn says
// otherwise. Run starts it.
func NewListener(pool *pgxpool.Pool, channel string, logger *slog.Logger, opts ...ListenerOption) *Listener {
	l := &Listener{pool: pool, channel: channel, logger: logger, connConfig: pool.Config().ConnConfig, probeEvery: defaultProbeEvery}
	for _, opt := range opts {
		opt(l)
	}
	l.listener = &pgxlisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			l.probe.Store(nil)
			l.healthy.Store(false)
			cfg := l.connConfig.Copy()
			cfg.BuildContextWatcherHandler = closeOnCancel
			return pgx.ConnectConfig(ctx, cfg)
		},
		LogError: func(ctx context.Context, err error) {
			l.probe.Store(nil)
			l.healthy.Store(false)
			if ctx.Err() == nil {
				logger.WarnContext(ctx, "listening for record changes failed; waiters poll until it reconnects", slog.Any("error", err))
			}
		},
		ReconnectDelay: 2 * time.Second,
	}
	l.listener.Handle(channel, listenHandler{l})
	return l
}

// listenHandler wakes the waiters a notification names and takes the
// Listener's probes.
type listenHandler struct{ l *Listener }

func (h listenHandler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	if p := h.l.probe.Load(); p != nil && n.Payload == *p {
		if h.l.probe.CompareAndSwap(p, nil) {
			h.l.healthy.Store(true)
		}
		return nil
	}
	if !strings.HasPrefix(n.Payload, probePrefix) { // else another replica's probe
		h.l.waiters.Wake(n.Payload)
	}
	return nil
}

// HandleBacklog runs after each LISTEN: it starts the new connection's
// probe.
func (h listenHandler) HandleBacklog(ctx context.Context, _ string, _ *pgx.Conn) error {
	payload := probePrefix + rand.Text()
	h.l.probe.Store(&payload)
	h.l.probes.Go(func() { h.l.awaitProbe(ctx, &payload) })
	return nil
}

// awaitProbe sends probe through the pool, as the Store sends its
// announcements, until it arrives or the connection it was for is gone,
// and warns once if it has not arrived after probeEvery.
func (l *Listener) awaitProbe(ctx context.Context, probe *string) {
	ticker := time.NewTicker(l.probeEvery)
	defer ticker.Stop()
	for warned := false; ; {
		if _, err := l.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, l.channel, *probe); err != nil && ctx.Err() == nil {
			l.logger.DebugContext(ctx, "could not send the listener's probe; sending it again", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if l.probe.Load() != probe {
			return // arrived, or its connection is gone
		}
		if !warned {
			warned = true
			l.logger.WarnContext(ctx, "notifications sent through the database pool do not reach the listening connection: "+
				"is a PgBouncer in transaction pooling mode in between? Give the listener a direct connection (-listen-database-url) "+
				"or turn notifications off (-notify=false); waiting duplicates poll every -poll-interval meanwhile",
				slog.Duration("waited", l.probeEvery))
		}
	}
}

// Run listens until ctx is done.
func (l *Listener) Run(ctx context.Context) {
	_ = l.listener.Listen(ctx) // returns only with ctx's error
	l.probes.Wait()
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

package pgstore

import (
	"context"
	"log/slog"
	"sync"
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

	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
}

var _ dedupesvc.Notifier = (*Listener)(nil)

// NewListener returns a Listener on channel (DefaultChannel unless the Store
// was given another) that connects like pool. Run starts it.
func NewListener(pool *pgxpool.Pool, channel string, logger *slog.Logger) *Listener {
	l := &Listener{waiters: map[string]map[chan struct{}]struct{}{}}
	connConfig := pool.Config().ConnConfig
	l.listener = &pgxlisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			return pgx.ConnectConfig(ctx, connConfig.Copy())
		},
		LogError: func(ctx context.Context, err error) {
			if ctx.Err() == nil {
				logger.WarnContext(ctx, "listening for record changes failed; waiters poll until it reconnects", slog.Any("error", err))
			}
		},
		ReconnectDelay: 2 * time.Second,
	}
	l.listener.Handle(channel, pgxlisten.HandlerFunc(func(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
		l.wake(n.Payload)
		return nil
	}))
	return l
}

// Run listens until ctx is done.
func (l *Listener) Run(ctx context.Context) {
	_ = l.listener.Listen(ctx) // returns only with ctx's error
}

// Subscribe implements dedupesvc.Notifier.
func (l *Listener) Subscribe(scope, key string) (<-chan struct{}, func()) {
	id := NotifyID(scope, key)
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	set, ok := l.waiters[id]
	if !ok {
		set = map[chan struct{}]struct{}{}
		l.waiters[id] = set
	}
	set[ch] = struct{}{}
	l.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			l.mu.Lock()
			delete(set, ch)
			if len(set) == 0 {
				delete(l.waiters, id)
			}
			l.mu.Unlock()
		})
	}
}

func (l *Listener) wake(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.waiters[id] {
		select {
		case ch <- struct{}{}:
		default: // already woken; it will re-read anyway
		}
	}
}

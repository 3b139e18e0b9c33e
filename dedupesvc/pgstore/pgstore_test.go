package pgstore_test

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

var (
	ctx  = context.Background()
	long = time.Hour
)

func TestConformance(t *testing.T) {
	storetest.RunWithNotifier(t, func(t *testing.T) dedupesvc.Store {
		pool, schema := pgtest.Schema(t)
		return pgstore.New(pool, pgstore.WithChannel(schema))
	}, listener)
}

// listener runs a Listener for the store s (built by TestConformance) until
// the test ends.
func listener(t *testing.T, s dedupesvc.Store) dedupesvc.Notifier {
	store := s.(*pgstore.Store)
	l := pgstore.NewListener(store.Pool(), store.Channel(), slog.Default())
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

func TestConformanceWithoutNotify(t *testing.T) {
	storetest.Run(t, func(t *testing.T) dedupesvc.Store { return pgstore.New(pgtest.Pool(t), pgstore.WithoutNotify()) })
}

func begin(token string) dedupesvc.BeginParams {
	fp := sha256.Sum256([]byte("request"))
	return dedupesvc.BeginParams{Scope: "/pkg.S/M", Key: "key-1", Fingerprint: fp[:], AttemptToken: token, Lease: long, Retention: long, UnknownRetention: long}
}

func mustReserve(t *testing.T, s *pgstore.Store) int64 {
	t.Helper()
	res, err := s.Begin(ctx, begin("t1"))
	if err != nil || res.State != dedupesvc.BeginReserved {
		t.Fatalf("Begin = %+v, %v; want reserved", res, err)
	}
	return res.Epoch
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t) // already migrated once
	applied, err := pgstore.Migrate(ctx, pool)
	if err != nil || len(applied) != 0 {
		t.Fatalf("second Migrate applied %v (%v), want nothing", applied, err)
	}
	status, err := pgstore.Status(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	all, _ := pgstore.Migrations()
	if len(status) != len(all) || len(all) == 0 {
		t.Fatalf("status has %d migrations, want %d", len(status), len(all))
	}
	for _, m := range status {
		if !m.Applied {
			t.Errorf("migration %s not applied", m.Name)
		}
	}
}

func TestListenerWakesSubscribersOfTheChangedKey(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	s := pgstore.New(pool, pgstore.WithChannel(schema))
	l := pgstore.NewListener(pool, schema, slog.Default())
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(runCtx) }()
	defer func() { cancel(); <-done }()

	other, unsubscribeOther := l.Subscribe(ctx, dedupesvc.RecordID{Scope: "/pkg.S/M", Key: "another key"})
	defer unsubscribeOther()
	<-other // no such record in flight: woken at once, to read what it is

	// The listener connects in the background; keep settling fresh waited-for
	// reservations until one notification arrives (a bounded wait, no timing
	// assertion: it fails only if nothing is ever delivered).
	deadline := time.After(20 * time.Second)
	for {
		epoch := mustReserve(t, s)
		woken, unsubscribe := l.Subscribe(ctx, dedupesvc.RecordID{Scope: "/pkg.S/M", Key: "key-1"})
		if err := s.Release(ctx, dedupesvc.ReleaseParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: "t1", Epoch: epoch}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-woken:
			unsubscribe()
			select {
			case <-other:
				t.Fatal("a subscriber of another key was woken")
			default:
			}
			return
		case <-time.After(100 * time.Millisecond):
			unsubscribe()
		case <-deadline:
			t.Fatal("no notification arrived within 20s")
		}
	}
}

func TestUnwatchedChangesSendNoNotify(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	s := pgstore.New(pool, pgstore.WithChannel(schema))
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN "`+schema+`"`); err != nil {
		t.Fatal(err)
	}
	epoch := mustReserve(t, s)
	outcome := dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.A", Value: []byte("A")}
	if err := s.Finish(ctx, dedupesvc.FinishParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: "t1", Epoch: epoch, Outcome: outcome}); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if n, err := conn.Conn().WaitForNotification(waitCtx); err == nil {
		t.Fatalf("a Finish nobody waited for sent NOTIFY %q", n.Payload)
	}
}

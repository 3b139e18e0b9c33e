package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/pgtest"
)

func TestLostOutcome(t *testing.T) {
	t.Parallel()

	t.Run("FAIL_CLOSED marks an abandoned lease unknown, for every caller", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		held := mustBegin(t, s, begin("crashed", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				res, err := s.Begin(ctx, begin("racer-"+string(rune('a'+i)), fpA, long, long))
				if err != nil || res.State != dedupesvc.BeginOutcomeUnknown || res.Epoch != held.Epoch {
					t.Errorf("Begin = %+v, %v; want outcome unknown for epoch %d", res, err, held.Epoch)
				}
			})
		}
		wg.Wait()
		mustBegin(t, s, begin("other-request", fpB, long, long), dedupesvc.BeginFingerprintMismatch)
	})

	t.Run("the holder's late Finish settles an unknown record", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		held := mustBegin(t, s, begin("slow", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginOutcomeUnknown)
		if _, err := s.Heartbeat(ctx, heartbeat("slow", held.Epoch)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("heartbeat on an unknown record: %v, want ErrNotHeld", err)
		}
		if err := s.Finish(ctx, finish("slow", held.Epoch, outA)); err != nil {
			t.Fatalf("late Finish: %v", err)
		}
		got := mustBegin(t, s, begin("t3", fpA, long, long), dedupesvc.BeginCompleted)
		if !bytes.Equal(got.Outcome.Value, outA.Value) {
			t.Fatalf("outcome %q, want %q", got.Outcome.Value, outA.Value)
		}
	})

	t.Run("a heartbeat keeps the lease", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		// A 1s lease renewed every 250ms outlives four leases' worth of
		// short ones with a wide margin for a loaded machine.
		held := mustBegin(t, s, begin("alive", fpA, time.Second, long), dedupesvc.BeginReserved)
		for range 4 {
			time.Sleep(250 * time.Millisecond)
			hb := heartbeat("alive", held.Epoch)
			hb.Lease = time.Second
			until, err := s.Heartbeat(ctx, hb)
			if err != nil || !until.After(held.LeaseExpiresAt) {
				t.Fatalf("Heartbeat = %v, %v; want a later lease end than %v", until, err, held.LeaseExpiresAt)
			}
		}
		mustBegin(t, s, reexecute(begin("taker", fpA, long, long)), dedupesvc.BeginInFlight)
		if _, err := s.Heartbeat(ctx, heartbeat("intruder", held.Epoch)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("a non-holder's heartbeat: %v, want ErrNotHeld", err)
		}
	})

	t.Run("unknown records outlive their retention until the unknown limit", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		mustBegin(t, s, begin("crashed", fpA, short, 5*short/2), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		p := begin("t2", fpA, long, long)
		p.UnknownRetention = 10 * short
		mustBegin(t, s, p, dedupesvc.BeginOutcomeUnknown)
		time.Sleep(short) // past the record's own retention, well within the unknown limit
		if n, _, err := s.DeleteExpired(ctx, 10); err != nil || n != 0 {
			t.Fatalf("DeleteExpired = %d, %v; an unresolved unknown record was swept early", n, err)
		}
		mustBegin(t, s, begin("t3", fpA, long, long), dedupesvc.BeginOutcomeUnknown)
		time.Sleep(10 * short)
		n, unknown, err := s.DeleteExpired(ctx, 10)
		if err != nil || n != 1 || len(unknown) != 1 || unknown[0].Key != "key-1" {
			t.Fatalf("DeleteExpired = %d, %v, %v; want the unknown record deleted and reported", n, unknown, err)
		}
	})
}

func heartbeat(token string, epoch int64) dedupesvc.HeartbeatParams {
	return dedupesvc.HeartbeatParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: token, Epoch: epoch, Lease: short}
}

func TestResolve(t *testing.T) {
	t.Parallel()
	resolve := func(complete *dedupesvc.Outcome) dedupesvc.ResolveParams {
		return dedupesvc.ResolveParams{Scope: "/pkg.S/M", Key: "key-1", Complete: complete}
	}
	unknownRecord := func(t *testing.T) *pgstore.Store {
		s := pgstore.New(pgtest.Pool(t))
		mustBegin(t, s, begin("crashed", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginOutcomeUnknown)
		return s
	}

	t.Run("complete, and a retry of it", func(t *testing.T) {
		t.Parallel()
		s := unknownRecord(t)
		if err := s.Resolve(ctx, resolve(&outA)); err != nil {
			t.Fatal(err)
		}
		if err := s.Resolve(ctx, resolve(&outA)); err != nil {
			t.Fatalf("retried Resolve: %v", err)
		}
		if err := s.Resolve(ctx, resolve(&outB)); !errors.Is(err, dedupesvc.ErrNotUnknown) {
			t.Fatalf("Resolve with another outcome: %v, want ErrNotUnknown", err)
		}
		got := mustBegin(t, s, begin("t3", fpA, long, long), dedupesvc.BeginCompleted)
		if !bytes.Equal(got.Outcome.Value, outA.Value) {
			t.Fatalf("outcome %q, want %q", got.Outcome.Value, outA.Value)
		}
	})

	t.Run("release, and a retry of it", func(t *testing.T) {
		t.Parallel()
		s := unknownRecord(t)
		if err := s.Resolve(ctx, resolve(nil)); err != nil {
			t.Fatal(err)
		}
		if err := s.Resolve(ctx, resolve(nil)); err != nil {
			t.Fatalf("retried Resolve: %v", err)
		}
		mustBegin(t, s, begin("t3", fpA, long, long), dedupesvc.BeginReserved)
	})

	t.Run("an abandoned lease nobody has asked about yet can be resolved", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		mustBegin(t, s, begin("crashed", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		if err := s.Resolve(ctx, resolve(&outA)); err != nil {
			t.Fatal(err)
		}
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginCompleted)
	})

	t.Run("a live reservation, a missing key", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		if err := s.Resolve(ctx, resolve(nil)); !errors.Is(err, dedupesvc.ErrRecordNotFound) {
			t.Fatalf("Resolve of a missing key: %v, want ErrRecordNotFound", err)
		}
		mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if err := s.Resolve(ctx, resolve(&outA)); !errors.Is(err, dedupesvc.ErrNotUnknown) {
			t.Fatalf("Resolve of a live reservation: %v, want ErrNotUnknown", err)
		}
	})
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

	other, unsubscribeOther := l.Subscribe(ctx, "/pkg.S/M", "another key")
	defer unsubscribeOther()
	<-other // no such record in flight: woken at once, to read what it is

	// The listener connects in the background; keep settling fresh waited-for
	// reservations until one notification arrives (a bounded wait, no timing
	// assertion: it fails only if nothing is ever delivered).
	deadline := time.After(20 * time.Second)
	for {
		held := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		woken, unsubscribe := l.Subscribe(ctx, "/pkg.S/M", "key-1")
		if err := s.Release(ctx, release("t1", held.Epoch)); err != nil {
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
	held := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
	if err := s.Finish(ctx, finish("t1", held.Epoch, outA)); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if n, err := conn.Conn().WaitForNotification(waitCtx); err == nil {
		t.Fatalf("a Finish nobody waited for sent NOTIFY %q", n.Payload)
	}
}

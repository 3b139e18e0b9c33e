package pgstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/pgtest"
)

var (
	ctx   = context.Background()
	fpA   = fingerprint("request A")
	fpB   = fingerprint("request B")
	outA  = dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.A", Value: []byte("outcome A")}
	outB  = dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.B", Value: []byte("outcome B")}
	long  = time.Hour
	short = 150 * time.Millisecond
)

func fingerprint(s string) []byte { sum := sha256.Sum256([]byte(s)); return sum[:] }

func begin(token string, fp []byte, lease, retention time.Duration) dedupesvc.BeginParams {
	return dedupesvc.BeginParams{Scope: "/pkg.S/M", Key: "key-1", Fingerprint: fp, AttemptToken: token, Lease: lease, Retention: retention, UnknownRetention: long}
}

// completed reserves key-1 for attempt t1 and finishes it with out.
func completed(t *testing.T, s *pgstore.Store, out dedupesvc.Outcome) dedupesvc.BeginResult {
	t.Helper()
	r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
	if err := s.Finish(ctx, finish("t1", r.Epoch, out)); err != nil {
		t.Fatal(err)
	}
	return r
}

func reexecute(p dedupesvc.BeginParams) dedupesvc.BeginParams {
	p.OnLostOutcome = dedupesvc.Reexecute
	return p
}

func mustBegin(t *testing.T, s *pgstore.Store, p dedupesvc.BeginParams, want dedupesvc.BeginState) dedupesvc.BeginResult {
	t.Helper()
	res, err := s.Begin(ctx, p)
	if err != nil {
		t.Fatalf("Begin(%s): %v", p.AttemptToken, err)
	}
	if res.State != want {
		t.Fatalf("Begin(%s) = %v, want %v", p.AttemptToken, res.State, want)
	}
	return res
}

func finish(token string, epoch int64, out dedupesvc.Outcome) dedupesvc.FinishParams {
	return dedupesvc.FinishParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: token, Epoch: epoch, Outcome: out}
}

func release(token string, epoch int64) dedupesvc.ReleaseParams {
	return dedupesvc.ReleaseParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: token, Epoch: epoch}
}

func TestBegin(t *testing.T) {
	t.Parallel()

	t.Run("reserves a new key, then answers in flight to others", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if r.Epoch != 1 || time.Until(r.LeaseExpiresAt) < 50*time.Minute {
			t.Fatalf("reserved epoch %d lease until %v, want epoch 1 and an hour's lease", r.Epoch, r.LeaseExpiresAt)
		}
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginInFlight)
	})

	t.Run("a retried Begin of the holder is reserved again, same epoch", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		first := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		again := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if again.Epoch != first.Epoch {
			t.Fatalf("retried Begin epoch %d, want %d", again.Epoch, first.Epoch)
		}
	})

	t.Run("another fingerprint is a mismatch in every state", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		mustBegin(t, s, begin("t2", fpB, long, long), dedupesvc.BeginFingerprintMismatch)
		if err := s.Finish(ctx, finish("t1", r.Epoch, outA)); err != nil {
			t.Fatal(err)
		}
		mustBegin(t, s, begin("t2", fpB, long, long), dedupesvc.BeginFingerprintMismatch)
	})

	t.Run("a completed key answers its outcome", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		completed(t, s, outA)
		got := mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginCompleted)
		if got.Outcome.TypeURL != outA.TypeURL || !bytes.Equal(got.Outcome.Value, outA.Value) {
			t.Fatalf("outcome %+v, want %+v", got.Outcome, outA)
		}
		if got.CompletedAt.IsZero() || time.Until(got.ExpiresAt) < 50*time.Minute {
			t.Fatalf("completed at %v, expires %v", got.CompletedAt, got.ExpiresAt)
		}
	})

	t.Run("an empty outcome is stored and replayed as empty", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if err := s.Finish(ctx, finish("t1", r.Epoch, dedupesvc.Outcome{TypeURL: outA.TypeURL, Value: []byte{}})); err != nil {
			t.Fatal(err)
		}
		got := mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginCompleted)
		if len(got.Outcome.Value) != 0 || got.Outcome.TypeURL != outA.TypeURL {
			t.Fatalf("outcome %+v, want the empty %s", got.Outcome, outA.TypeURL)
		}
	})

	t.Run("under REEXECUTE an abandoned lease is taken over with a higher epoch", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		old := mustBegin(t, s, begin("t1", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		taken := mustBegin(t, s, reexecute(begin("t2", fpA, long, long)), dedupesvc.BeginReserved)
		if taken.Epoch != old.Epoch+1 {
			t.Fatalf("takeover epoch %d, want %d", taken.Epoch, old.Epoch+1)
		}
		if err := s.Finish(ctx, finish("t1", old.Epoch, outB)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("stale holder's Finish: %v, want ErrNotHeld", err)
		}
		if err := s.Finish(ctx, finish("t2", taken.Epoch, outA)); err != nil {
			t.Fatal(err)
		}
		got := mustBegin(t, s, begin("t3", fpA, long, long), dedupesvc.BeginCompleted)
		if !bytes.Equal(got.Outcome.Value, outA.Value) {
			t.Fatalf("outcome %q, want the new holder's %q", got.Outcome.Value, outA.Value)
		}
	})

	t.Run("an expired record counts as absent, whatever its request", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		r := mustBegin(t, s, begin("t1", fpA, short, short), dedupesvc.BeginReserved)
		if err := s.Finish(ctx, finish("t1", r.Epoch, outA)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * short)
		mustBegin(t, s, begin("t2", fpB, long, long), dedupesvc.BeginReserved)
	})
}

func TestBeginConcurrent(t *testing.T) {
	t.Parallel()

	race := func(t *testing.T, s *pgstore.Store, n int, onLost dedupesvc.LostOutcome) (reserved []string) {
		t.Helper()
		var (
			mu sync.Mutex
			wg sync.WaitGroup
		)
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				token := fmt.Sprintf("racer-%d", i)
				p := begin(token, fpA, long, long)
				p.OnLostOutcome = onLost
				res, err := s.Begin(ctx, p)
				if err != nil {
					t.Errorf("Begin: %v", err)
					return
				}
				switch res.State {
				case dedupesvc.BeginReserved:
					mu.Lock()
					reserved = append(reserved, token)
					mu.Unlock()
				case dedupesvc.BeginInFlight:
				default:
					t.Errorf("Begin = %v, want reserved or in flight", res.State)
				}
			})
		}
		close(start)
		wg.Wait()
		return reserved
	}

	t.Run("64 racers on a new key: exactly one reserves", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		if got := race(t, s, 64, dedupesvc.FailClosed); len(got) != 1 {
			t.Fatalf("%d racers reserved (%v), want exactly 1", len(got), got)
		}
	})

	t.Run("32 racers on an abandoned lease under REEXECUTE: exactly one takes over", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		mustBegin(t, s, begin("crashed", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		if got := race(t, s, 32, dedupesvc.Reexecute); len(got) != 1 {
			t.Fatalf("%d racers took over (%v), want exactly 1", len(got), got)
		}
	})
}

func TestFinish(t *testing.T) {
	t.Parallel()

	t.Run("a retried Finish succeeds and keeps the first outcome", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		r := completed(t, s, outA)
		if err := s.Finish(ctx, finish("t1", r.Epoch, outB)); err != nil {
			t.Fatalf("retried Finish: %v, want success", err)
		}
		got := mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginCompleted)
		if !bytes.Equal(got.Outcome.Value, outA.Value) {
			t.Fatalf("outcome %q, want the first %q", got.Outcome.Value, outA.Value)
		}
	})

	t.Run("a Finish from a non-holder is refused and changes nothing", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		for _, p := range []dedupesvc.FinishParams{finish("intruder", r.Epoch, outB), finish("t1", r.Epoch+1, outB)} {
			if err := s.Finish(ctx, p); !errors.Is(err, dedupesvc.ErrNotHeld) {
				t.Fatalf("Finish(%s, epoch %d): %v, want ErrNotHeld", p.AttemptToken, p.Epoch, err)
			}
		}
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginInFlight)
		if err := s.Finish(ctx, finish("t1", r.Epoch, outA)); err != nil {
			t.Fatal(err)
		}
		if err := s.Finish(ctx, finish("intruder", r.Epoch, outB)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("Finish after completion from a non-holder: %v, want ErrNotHeld", err)
		}
		got := mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginCompleted)
		if !bytes.Equal(got.Outcome.Value, outA.Value) {
			t.Fatalf("outcome %q, want %q", got.Outcome.Value, outA.Value)
		}
	})

	t.Run("a Finish for a key that does not exist is refused", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		if err := s.Finish(ctx, finish("t1", 1, outA)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("Finish: %v, want ErrNotHeld", err)
		}
	})
}

func TestRelease(t *testing.T) {
	t.Parallel()

	t.Run("release frees the key for the next attempt, and a retry succeeds", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if err := s.Release(ctx, release("t1", r.Epoch)); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, release("t1", r.Epoch)); err != nil {
			t.Fatalf("retried Release: %v", err)
		}
		next := mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginReserved)
		if next.Epoch != r.Epoch+1 {
			t.Fatalf("epoch after release %d, want %d", next.Epoch, r.Epoch+1)
		}
		if err := s.Release(ctx, release("t1", r.Epoch)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("stale Release after another attempt reserved: %v, want ErrNotHeld", err)
		}
		mustBegin(t, s, begin("t3", fpA, long, long), dedupesvc.BeginInFlight)
	})

	t.Run("a released key still refuses another request", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if err := s.Release(ctx, release("t1", r.Epoch)); err != nil {
			t.Fatal(err)
		}
		mustBegin(t, s, begin("t2", fpB, long, long), dedupesvc.BeginFingerprintMismatch)
	})

	t.Run("a completed record cannot be released", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		r := completed(t, s, outA)
		if err := s.Release(ctx, release("t1", r.Epoch)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("Release after Finish: %v, want ErrNotHeld", err)
		}
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginCompleted)
	})

	t.Run("releasing a key that does not exist succeeds", func(t *testing.T) {
		t.Parallel()
		s := pgstore.New(pgtest.Pool(t))
		if err := s.Release(ctx, release("t1", 1)); err != nil {
			t.Fatalf("Release: %v", err)
		}
	})
}

func TestSweeperDeletesExpiredInBatches(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := pgstore.New(pool)
	for i := range 25 {
		p := begin(fmt.Sprint("t", i), fpA, short, short)
		p.Key = fmt.Sprint("expired-", i)
		mustBegin(t, s, p, dedupesvc.BeginReserved)
	}
	for i := range 5 {
		p := begin(fmt.Sprint("t", i), fpA, long, long)
		p.Key = fmt.Sprint("live-", i)
		mustBegin(t, s, p, dedupesvc.BeginReserved)
	}
	time.Sleep(2 * short)

	var batches []int
	counting := countingStore{Store: s, batches: &batches}
	n, err := dedupesvc.NewSweeper(counting, dedupesvc.SweeperConfig{BatchSize: 10}).SweepOnce(ctx)
	if err != nil || n != 25 {
		t.Fatalf("SweepOnce = %d, %v; want 25 deleted", n, err)
	}
	if fmt.Sprint(batches) != "[10 10 5]" {
		t.Fatalf("batches %v, want [10 10 5]", batches)
	}
	var left int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM idemgate_records WHERE idempotency_key LIKE 'live-%'").Scan(&left); err != nil || left != 5 {
		t.Fatalf("%d live rows left (%v), want 5", left, err)
	}
	var total int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM idemgate_records").Scan(&total); err != nil || total != 5 {
		t.Fatalf("%d rows left (%v), want only the 5 live ones", total, err)
	}
}

type countingStore struct {
	*pgstore.Store
	batches *[]int
}

func (c countingStore) DeleteExpired(ctx context.Context, limit int) (int, []dedupesvc.RecordID, error) {
	n, unknown, err := c.Store.DeleteExpired(ctx, limit)
	*c.batches = append(*c.batches, n)
	return n, unknown, err
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

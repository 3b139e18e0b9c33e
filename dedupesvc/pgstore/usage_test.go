package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/netfault"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// usage is one namespace's totals.
type usage struct{ records, bytes int64 }

// countedUsage is what Begin checks the quotas against: the compacted
// totals.
func countedUsage(t *testing.T, pool *pgxpool.Pool) map[string]usage {
	t.Helper()
	return usageOf(t, pool, `SELECT namespace, sum(records)::bigint, sum(outcome_bytes)::bigint FROM idemgate_namespace_usage GROUP BY namespace`)
}

// actualUsage counts the records themselves.
func actualUsage(t *testing.T, pool *pgxpool.Pool) map[string]usage {
	t.Helper()
	return usageOf(t, pool, `SELECT namespace, count(*), coalesce(sum(octet_length(outcome_value)), 0)::bigint FROM idemgate_records GROUP BY namespace`)
}

func usageOf(t *testing.T, pool *pgxpool.Pool, sql string) map[string]usage {
	t.Helper()
	rows, err := pool.Query(ctx, sql)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]usage{}
	var (
		ns string
		u  usage
	)
	if _, err := pgx.ForEachRow(rows, []any{&ns, &u.records, &u.bytes}, func() error {
		if u != (usage{}) {
			out[ns] = u
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func wantUsage(t *testing.T, what string, pool *pgxpool.Pool) {
	t.Helper()
	got, want := countedUsage(t, pool), actualUsage(t, pool)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: counted usage %v, the records hold %v", what, got, want)
	}
}

// compactAll compacts until no change is left (a compaction of another
// replica may hold the compaction row for a moment), and returns how many
// changes it moved.
func compactAll(t *testing.T, pool *pgxpool.Pool, s *pgstore.Store) int64 {
	t.Helper()
	var moved int64
	deadline := time.Now().Add(time.Minute)
	for {
		moved += compact(t, s)
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idemgate_usage_changes`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return moved
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d usage changes left after a minute of compacting", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func compact(t *testing.T, s *pgstore.Store) int64 {
	t.Helper()
	n, err := s.CompactUsage(ctx)
	if err != nil {
		t.Fatalf("CompactUsage: %v", err)
	}
	return n
}

// TestCompactUsageCountsEveryChangeOnce walks a record through every write
// that changes usage (reserve, Finish, takeover of an expired outcome,
// sweep) and wants the compacted totals to equal a count of the records,
// and a Begin to see them only once compacted.
func TestCompactUsageCountsEveryChangeOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := pgstore.New(pool)
	p := func(ns, key string, life time.Duration) dedupesvc.BeginParams {
		p := begin("t-" + key)
		p.Namespace, p.Key, p.Lease, p.Retention = ns, key, life, life
		return p
	}
	finish := func(bp dedupesvc.BeginParams, epoch int64, size int) {
		t.Helper()
		if err := s.Finish(ctx, dedupesvc.FinishParams{Namespace: bp.Namespace, Scope: bp.Scope, Key: bp.Key, AttemptToken: bp.AttemptToken, Epoch: epoch,
			Outcome: dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.A", Value: make([]byte, size)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, ns := range []string{"a", "b"} {
		for k := range 3 {
			bp := p(ns, fmt.Sprint("k", k), time.Hour)
			res := mustBeginPG(t, s, bp, dedupesvc.BeginReserved)
			finish(bp, res.Epoch, 100*(i+1)+k)
		}
	}
	short := p("a", "short", dedupesvc.MinLease)
	res := mustBeginPG(t, s, short, dedupesvc.BeginReserved)
	finish(short, res.Epoch, 1000)
	if got := countedUsage(t, pool); len(got) != 0 {
		t.Fatalf("before any compaction the totals are %v, want none: compaction, not the writing transaction, counts", got)
	}
	if n := compact(t, s); n != 7+7 {
		t.Fatalf("the first compaction moved %d changes, want 14 (7 reservations, 7 outcomes)", n)
	}
	wantUsage(t, "after reserving and finishing", pool)
	if n := compact(t, s); n != 0 {
		t.Fatalf("a second compaction moved %d changes, want 0", n)
	}
	wantUsage(t, "after compacting again", pool)

	// The short record expires: a takeover drops its outcome, then the
	// sweeper deletes what expired.
	time.Sleep(dedupesvc.MinLease + 100*time.Millisecond)
	takeover := short
	takeover.AttemptToken, takeover.OnLostOutcome = "t-takeover", dedupesvc.Reexecute // swept once its lease ends
	mustBeginPG(t, s, takeover, dedupesvc.BeginReserved)
	compact(t, s)
	wantUsage(t, "after a takeover", pool)
	time.Sleep(dedupesvc.MinLease + 100*time.Millisecond)
	if n, _, err := s.DeleteExpired(ctx, 100); err != nil || n != 1 {
		t.Fatalf("DeleteExpired = %d, %v; want the one expired record", n, err)
	}
	compact(t, s)
	wantUsage(t, "after a sweep", pool)
}

// TestConcurrentCompactionsCountOnce runs writers on two stores (two
// replicas) while both compact as fast as they can: every change counts
// exactly once however the compactions interleave.
func TestConcurrentCompactionsCountOnce(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	stores := []*pgstore.Store{pgstore.New(pool), pgstore.New(pgtest.OpenPool(t, schema))}
	// Stopped by a flag, not by cancelling: a compaction cancelled while it
	// commits may have moved its changes yet return an error.
	var (
		compactions sync.WaitGroup
		compacted   atomic.Int64
		stop        atomic.Bool
	)
	for _, s := range stores {
		for range 2 {
			compactions.Go(func() {
				for !stop.Load() {
					n, err := s.CompactUsage(ctx)
					if err != nil {
						t.Errorf("CompactUsage: %v", err)
						return
					}
					compacted.Add(n)
				}
			})
		}
	}
	var writers sync.WaitGroup
	for w := range 8 {
		s := stores[w%2]
		writers.Go(func() {
			for k := range 25 {
				bp := begin("t")
				bp.Namespace, bp.Key = fmt.Sprint("ns-", w%3), fmt.Sprintf("w%d-k%d", w, k)
				res, err := s.Begin(ctx, bp)
				if err != nil || res.State != dedupesvc.BeginReserved {
					t.Errorf("Begin = %+v, %v", res, err)
					return
				}
				if err := s.Finish(ctx, dedupesvc.FinishParams{Namespace: bp.Namespace, Scope: bp.Scope, Key: bp.Key, AttemptToken: bp.AttemptToken, Epoch: res.Epoch,
					Outcome: dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.A", Value: make([]byte, k+1)}}); err != nil {
					t.Errorf("Finish: %v", err)
					return
				}
			}
		})
	}
	writers.Wait()
	stop.Store(true)
	compactions.Wait()
	compacted.Add(compactAll(t, pool, stores[0]))
	if n := compacted.Load(); n != 8*25*2 {
		t.Errorf("compactions moved %d changes in all, want %d", n, 8*25*2)
	}
	wantUsage(t, "after concurrent writers and compactions", pool)
}

// TestQuotaSeesUsageOnceCompacted: a quota is checked against the totals as
// of the last compaction. Concurrent Begins between two compactions may
// overshoot it (the test logs by how much); once compacted, the next Begin
// is refused.
func TestQuotaSeesUsageOnceCompacted(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := pgstore.New(pool)
	const limit = 20
	var (
		wg       sync.WaitGroup
		reserved atomic.Int64
		stop     = make(chan struct{})
	)
	c, cancel := context.WithCancel(ctx)
	var compacting sync.WaitGroup
	compacting.Go(func() { dedupesvc.RunUsageCompaction(c, s, 20*time.Millisecond, nil) })
	stopCompacting := func() { cancel(); compacting.Wait() }
	defer stopCompacting()
	for w := range 16 {
		wg.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				bp := begin("t")
				bp.Namespace, bp.Key, bp.MaxRecords = "greedy", fmt.Sprintf("w%d-k%d", w, k), limit
				res, err := s.Begin(ctx, bp)
				switch {
				case errors.Is(err, dedupesvc.ErrQuotaExceeded):
					return
				case err != nil || res.State != dedupesvc.BeginReserved:
					t.Errorf("Begin = %+v, %v", res, err)
					return
				}
				reserved.Add(1)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		close(stop)
		<-done
		t.Fatal("16 writers reserved for 2 minutes without meeting the quota: compaction never caught up")
	}
	t.Logf("quota %d records: %d reserved by 16 concurrent writers with compaction every 20ms (overshoot %d)", limit, reserved.Load(), reserved.Load()-limit)
	if reserved.Load() < limit {
		t.Fatalf("%d reserved, fewer than the quota of %d", reserved.Load(), limit)
	}
	stopCompacting()
	compact(t, s)
	bp := begin("t")
	bp.Namespace, bp.Key, bp.MaxRecords = "greedy", "after", limit
	if _, err := s.Begin(ctx, bp); !errors.Is(err, dedupesvc.ErrQuotaExceeded) {
		t.Fatalf("Begin after compacting = %v, want a quota error", err)
	}
}

// TestUpgradeFoldsUsageShards: a schema at migration 009 counted usage in
// up to 16 shard rows per namespace, in the writing transaction; after 010
// the totals are one row per namespace, unchanged, and writes keep being
// counted (once compacted).
func TestUpgradeFoldsUsageShards(t *testing.T) {
	t.Parallel()
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, schema := pgtest.EmptySchema(t)
	if m := migratedBefore(c, t, pool, 10); m.Version != 10 {
		t.Fatal("no migration 010")
	}
	// Writes from several connections land in several shards. Plain
	// INSERTs, as the previous version reserved: this version's Begin reads
	// the changes table of 010.
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for k := range 5 {
				if _, err := pool.Exec(c, `INSERT INTO idemgate_records (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
					retention_ms, lease_ms, lease_expires_at, expires_at)
					VALUES ($1, '/pkg.S/M', $2, '\x00'::bytea, 'in_flight', 't', 1, 3600000, 60000, now() + interval '1 minute', now() + interval '1 hour')`,
					fmt.Sprint("ns-", w%2), fmt.Sprintf("w%d-k%d", w, k)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	var shards int
	if err := pool.QueryRow(c, `SELECT count(*) FROM idemgate_namespace_usage`).Scan(&shards); err != nil {
		t.Fatal(err)
	}
	if shards < 3 {
		t.Fatalf("%d usage rows before the upgrade from 8 connections in 2 namespaces; want shards to fold (more than one per namespace)", shards)
	}
	wantUsage(t, "before the upgrade", pool)
	if _, err := pgstore.Migrate(c, pool); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := pool.QueryRow(c, `SELECT count(*) FROM idemgate_namespace_usage`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 2 {
		t.Fatalf("after the upgrade %d usage rows (from %d shard rows), want one per namespace", rows, shards)
	}
	wantUsage(t, "after the upgrade", pool)
	s := pgstore.New(pgtest.OpenPool(t, schema))
	bp := begin("t")
	bp.Namespace, bp.Key = "ns-0", "after-upgrade"
	mustBeginPG(t, s, bp, dedupesvc.BeginReserved)
	compact(t, s)
	wantUsage(t, "a write after the upgrade, compacted", pool)
}

func mustBeginPG(t *testing.T, s *pgstore.Store, p dedupesvc.BeginParams, want dedupesvc.BeginState) dedupesvc.BeginResult {
	t.Helper()
	res, err := s.Begin(ctx, p)
	if err != nil || res.State != want {
		t.Fatalf("Begin(%s/%s) = %+v, %v; want state %v", p.Namespace, p.Key, res, err, want)
	}
	return res
}

// TestCompactionSkipsARoundAnotherReplicaHolds: while one replica's
// compaction holds the compaction row, another's moves nothing and returns
// at once instead of queueing behind it; the changes wait for the next round.
func TestCompactionSkipsARoundAnotherReplicaHolds(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	s := pgstore.New(pgtest.OpenPool(t, schema))
	bp := begin("t")
	bp.Namespace, bp.Key = "a", "k"
	mustBeginPG(t, s, bp, dedupesvc.BeginReserved)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT id FROM idemgate_usage_compaction FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	held, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if n, err := s.CompactUsage(held); err != nil || n != 0 {
		t.Fatalf("CompactUsage while another replica holds the row = %d, %v; want 0 moved, no error, no wait", n, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := compact(t, s); n != 1 {
		t.Fatalf("the next round moved %d changes, want the 1 left", n)
	}
}

// TestUsageEqualsRowsOverEveryPath runs, concurrently in two namespaces,
// every write that changes usage (reserve, Finish, Finish over the bytes
// quota replaced by its marker, Release and a Begin over the released key,
// takeover of an expired outcome, sweep, forget) while a compaction runs
// beside them; once compacted, the totals equal count(*) and the sum of
// octet_length(outcome_value) over the rows, namespace by namespace.
func TestUsageEqualsRowsOverEveryPath(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := pgstore.New(pool)
	c, cancel := context.WithCancel(ctx)
	var compacting sync.WaitGroup
	compacting.Go(func() { dedupesvc.RunUsageCompaction(c, s, 10*time.Millisecond, nil) })
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			ns := fmt.Sprint("ns-", w%2)
			for k := range 12 {
				bp := begin(fmt.Sprintf("t-%d-%d", w, k))
				bp.Namespace, bp.Key = ns, fmt.Sprintf("w%d-k%d", w, k)
				bp.MaxOutcomeBytes = 1 << 20
				if k%3 == 0 {
					bp.Lease, bp.Retention = dedupesvc.MinLease, dedupesvc.MinLease
				}
				res, err := s.Begin(ctx, bp)
				if err != nil || res.State != dedupesvc.BeginReserved {
					t.Errorf("Begin = %+v, %v", res, err)
					return
				}
				fp := dedupesvc.FinishParams{Namespace: ns, Scope: bp.Scope, Key: bp.Key, AttemptToken: bp.AttemptToken, Epoch: res.Epoch,
					Outcome: dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.A", Value: make([]byte, 1000*(k+1))}}
				switch k % 4 {
				case 0, 1:
					err = s.Finish(ctx, fp)
				case 2:
					// Over a small bytes quota: the marker is stored instead.
					fp.MaxOutcomeBytes = 1
					marker := dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.Marker", Value: []byte("marker")}
					fp.OverQuota = &marker
					_, err = s.FinishWithinQuota(ctx, fp)
				case 3:
					err = s.Release(ctx, dedupesvc.ReleaseParams{Namespace: ns, Scope: bp.Scope, Key: bp.Key, AttemptToken: bp.AttemptToken, Epoch: res.Epoch})
					if err == nil {
						again := bp
						again.AttemptToken += "-again"
						_, err = s.Begin(ctx, again)
					}
				}
				if err != nil {
					t.Errorf("key %s: %v", bp.Key, err)
					return
				}
				if k%5 == 4 {
					if _, err := s.ForgetRecord(ctx, dedupesvc.ForgetParams{ID: dedupesvc.RecordID{Namespace: ns, Scope: bp.Scope, Key: bp.Key}, Force: true}); err != nil {
						t.Errorf("forget %s: %v", bp.Key, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	// The short records expire: some are taken over, the rest swept.
	time.Sleep(dedupesvc.MinLease + 100*time.Millisecond)
	for w := range 8 {
		bp := begin("t-takeover")
		bp.Namespace, bp.Key, bp.OnLostOutcome = fmt.Sprint("ns-", w%2), fmt.Sprintf("w%d-k0", w), dedupesvc.Reexecute
		bp.Lease, bp.Retention = dedupesvc.MinLease, dedupesvc.MinLease
		if _, err := s.Begin(ctx, bp); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(dedupesvc.MinLease + 100*time.Millisecond)
	for {
		n, _, err := s.DeleteExpired(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	cancel()
	compacting.Wait()
	compactAll(t, pool, s)
	wantUsage(t, "after every path, compacted", pool)
}

// TestACompactionRoundWithNothingToMoveTakesNoLock: with no change waiting,
// a round reads the changes table and nothing else, so it takes no row lock
// on the compaction row and writes nothing (issue 32: every replica took
// that lock every second). Another session holding the compaction table in
// EXCLUSIVE mode, which blocks every write to it and SELECT ... FOR UPDATE
// but no plain read, shows it: the empty round returns at once; a round
// with a change to move waits for that session.
func TestACompactionRoundWithNothingToMoveTakesNoLock(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	s := pgstore.New(pgtest.OpenPool(t, schema))
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE idemgate_usage_compaction IN EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	held, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if n, lag, err := s.CompactUsageLag(held); err != nil || n != 0 || lag != 0 {
		t.Fatalf("an empty round while the compaction table is locked = %d, %v, %v; want 0, 0, no error and no wait", n, lag, err)
	}

	// The lock does stop a round with work to do.
	bp := begin("t")
	bp.Namespace, bp.Key = "a", "k"
	mustBeginPG(t, s, bp, dedupesvc.BeginReserved)
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	if n, err := s.CompactUsage(short); err == nil {
		t.Fatalf("a round with a change to move compacted %d under the other session's lock", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := compactAll(t, pool, s); n != 1 {
		t.Fatalf("compacted %d changes once the lock was gone, want 1", n)
	}
}

// TestCompactionLagIsTheOldestWaitingChangesAge: a round reports how old
// the oldest change it found waiting was (migration 012's changed_at), and
// 0 once nothing waits.
func TestCompactionLagIsTheOldestWaitingChangesAge(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	s := pgstore.New(pgtest.OpenPool(t, schema))
	bp := begin("t")
	bp.Namespace, bp.Key = "a", "k"
	mustBeginPG(t, s, bp, dedupesvc.BeginReserved)
	// A change left over from an hour ago, as if compaction had failed
	// since (it changes nothing: 0 records, 0 bytes).
	if _, err := pool.Exec(ctx, `INSERT INTO idemgate_usage_changes (namespace, records, outcome_bytes, changed_at) VALUES ('a', 0, 0, now() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	n, lag, err := s.CompactUsageLag(ctx)
	if err != nil || n != 2 || lag < time.Hour || lag > time.Hour+10*time.Minute {
		t.Fatalf("CompactUsageLag = %d, %v, %v; want 2 moved, a lag of an hour", n, lag, err)
	}
	if n, lag, err := s.CompactUsageLag(ctx); err != nil || n != 0 || lag != 0 {
		t.Fatalf("the next round = %d, %v, %v; want 0, 0", n, lag, err)
	}
	wantUsage(t, "compacted", pool)
}

// TestCompactionVacuumsTheUsageChanges: a compaction that brings the
// changes moved since the last vacuum to WithUsageVacuumEvery vacuums
// idemgate_usage_changes, whose every row a compaction deletes: without a
// vacuum a round's scan grows with every change ever moved (issue 39: 4.6
// million dead rows, 311 MB, after 30 minutes on a PostgreSQL without
// autovacuum). As the runtime role, which does not own the table, it is
// left to autovacuum and the compaction still moves the changes.
func TestCompactionVacuumsTheUsageChanges(t *testing.T) {
	t.Parallel()
	fill := func(t *testing.T, pool *pgxpool.Pool, n int) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO idemgate_usage_changes (namespace, records, outcome_bytes) SELECT 'vacuumed', 1, 0 FROM generate_series(1, $1::int)`, n); err != nil {
			t.Fatal(err)
		}
	}
	size := func(t *testing.T, pool *pgxpool.Pool) int64 {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, `SELECT pg_relation_size('idemgate_usage_changes')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	t.Run("owner", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t)
		s := pgstore.New(pool, pgstore.WithoutNotify(), pgstore.WithUsageVacuumEvery(3000))
		for round, want := range []int64{0, 1, 1, 2} {
			fill(t, pool, 2000)
			before := size(t, pool)
			if moved, err := s.CompactUsage(ctx); err != nil || moved != 2000 {
				t.Fatalf("round %d: CompactUsage = %d, %v; want 2000 moved", round, moved, err)
			}
			vacuums, allowed := s.UsageVacuums()
			t.Logf("round %d: table %d bytes before, %d after; %d vacuums", round, before, size(t, pool), vacuums)
			if vacuums != want || (want > 0 && !allowed) {
				t.Fatalf("after %d changes moved, %d vacuums (allowed %v); want %d, every 3,000", 2000*(round+1), vacuums, allowed, want)
			}
		}
	})
	t.Run("runtime role", func(t *testing.T) {
		t.Parallel()
		roles := pgtest.NewRoles(t)
		owner := openPool(t, roles.OwnerURL(t))
		s := pgstore.New(openPool(t, roles.RuntimeURL(t)), pgstore.WithoutNotify(), pgstore.WithUsageVacuumEvery(1000))
		for range 2 {
			fill(t, owner, 2000)
			if moved, err := s.CompactUsage(ctx); err != nil || moved != 2000 {
				t.Fatalf("CompactUsage as the runtime role = %d, %v; want 2000 moved", moved, err)
			}
		}
		if vacuums, allowed := s.UsageVacuums(); vacuums != 0 || allowed {
			t.Fatalf("as the runtime role: %d vacuums, allowed %v; want none, left to autovacuum", vacuums, allowed)
		}
	})
}

// TestUsageVacuumSurvivesAFailure: a compaction's vacuum that fails for
// want of the database (the connection reset while it asks whether its
// role may vacuum, or while it vacuums) is tried again at the next
// threshold; only the database's refusal (no privilege, no VACUUM) stops
// the replica asking. Before, any failure of the ownership check, and any
// error the server sent (a restart's 57P01 among them), turned the vacuum
// off until the replica restarted, and the usage changes grew again.
func TestUsageVacuumSurvivesAFailure(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		err     error
		refused bool
	}{
		{"insufficient privilege", &pgconn.PgError{Code: "42501"}, true},
		{"no VACUUM statement", &pgconn.PgError{Code: "42601"}, true},
		{"feature not supported", &pgconn.PgError{Code: "0A000"}, true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, false},
		{"statement timeout", &pgconn.PgError{Code: "57014"}, false},
		{"connection failure", &pgconn.PgError{Code: "08006"}, false},
		{"out of memory", &pgconn.PgError{Code: "53200"}, false},
		{"connection reset", io.ErrUnexpectedEOF, false},
	} {
		if got := pgstore.VacuumRefusedForTest(tt.err); got != tt.refused {
			t.Errorf("%s: refused = %v, want %v", tt.name, got, tt.refused)
		}
	}

	_, schema := pgtest.Schema(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := netfault.NewProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(proxy.Addr())
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := pgstore.New(pool, pgstore.WithoutNotify())
	// failOnce runs the vacuum with every connection reset, then heals.
	failOnce := func(want int64) {
		t.Helper()
		proxy.Reset()
		s.VacuumUsageForTest(ctx)
		proxy.Heal()
		pool.Reset() // the connections the fault broke
		if vacuums, _ := s.UsageVacuums(); vacuums != want {
			t.Fatalf("%d vacuums with every connection reset, want %d", vacuums, want)
		}
	}
	failOnce(0) // in the ownership check
	s.VacuumUsageForTest(ctx)
	if vacuums, allowed := s.UsageVacuums(); vacuums != 1 || !allowed {
		t.Fatalf("after the ownership check failed for want of the database: %d vacuums, allowed %v; want 1 and true", vacuums, allowed)
	}
	failOnce(1) // in the vacuum
	s.VacuumUsageForTest(ctx)
	if vacuums, allowed := s.UsageVacuums(); vacuums != 2 || !allowed {
		t.Fatalf("after a vacuum failed for want of the database: %d vacuums, allowed %v; want 2 and true", vacuums, allowed)
	}
}

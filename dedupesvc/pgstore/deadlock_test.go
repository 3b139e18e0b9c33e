package pgstore_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// The store's writers lock rows in three ways: a batch (one transaction of
// many statements, sorted by record), a lone statement, and the sweeper's
// multi-row DELETE. These tests hold a batch's transaction open between its
// statements, so the interleaving that deadlocked happens every time instead
// of once in a while: with the quota counters updated in the reserving
// transaction (migration 005, before 010), each case aborted one side with
// 40P01 after deadlock_timeout.

// sameShardConns opens connections on schema until two have backend pids
// equal modulo 16 (the old counters' shard), and returns those two.
func sameShardConns(t *testing.T, schema string) (a, b *pgx.Conn) {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["search_path"] = schema
	byShard := map[uint32]*pgx.Conn{}
	for range 17 {
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		shard := c.PgConn().PID() % 16
		if other, ok := byShard[shard]; ok {
			return other, c
		}
		byShard[shard] = c
	}
	t.Fatal("17 connections and no two on one shard: cannot happen")
	return nil, nil
}

// firstArgs are firstSQL's arguments for key in namespace ns, with quotas on
// (so the usage is read, as with the service's defaults); lease and
// retention in milliseconds.
func firstArgs(ns, key string, leaseMS, retentionMS int64) []any {
	fp := sha256.Sum256([]byte(key))
	return []any{"/pkg.S/M", key, fp[:], "tok-" + key, leaseMS, retentionMS, ns, int64(1 << 40), int64(1 << 50), int64(0)}
}

// lockWait runs sql on c in the background and returns a channel with its
// error, once the statement finished or is waiting for a lock (seen through
// pool), whichever comes first.
func lockWait(t *testing.T, pool *pgxpool.Pool, c *pgx.Conn, sql string, args ...any) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, sql, args...)
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if len(done) > 0 {
			return done
		}
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`,
			c.PgConn().PID()).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return done
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the concurrent statement neither finished nor waited for a lock in 30s")
	return nil
}

// noDeadlock fails the test for any error, naming a deadlock as such.
func noDeadlock(t *testing.T, what string, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "40P01":
		t.Errorf("%s: deadlock: %v", what, err)
	case err != nil:
		t.Errorf("%s: %v", what, err)
	}
}

func TestBatchAndLoneBeginDoNotDeadlock(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	batch, lone := sameShardConns(t, schema)

	tx, err := batch.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// The batch's first key, then a lone Begin of the batch's second key.
	if _, err := tx.Exec(ctx, pgstore.FirstSQLForTest, firstArgs("n", "a", 60000, 3600000)...); err != nil {
		t.Fatal(err)
	}
	loneDone := lockWait(t, pool, lone, pgstore.FirstSQLForTest, firstArgs("n", "b", 60000, 3600000)...)
	_, batchErr := tx.Exec(ctx, pgstore.FirstSQLForTest, firstArgs("n", "b", 60000, 3600000)...)
	if batchErr == nil {
		batchErr = tx.Commit(ctx)
	}
	noDeadlock(t, "the batch", batchErr)
	noDeadlock(t, "the lone Begin", <-loneDone)
}

func TestSweeperAndBatchDoNotDeadlock(t *testing.T) {
	t.Parallel()

	// Two expired records of two namespaces, n2's older, so the sweep takes
	// n2 first and a batch (sorted) takes n1 first.
	expired := func(t *testing.T, pool *pgxpool.Pool) {
		t.Helper()
		for _, ns := range []string{"n2", "n1"} {
			if _, err := pool.Exec(ctx, pgstore.FirstSQLForTest, firstArgs(ns, "old-"+ns, 1, 1)...); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}

	t.Run("fresh keys beside the deleted ones", func(t *testing.T) {
		t.Parallel()
		pool, schema := pgtest.Schema(t)
		batch, sweeper := sameShardConns(t, schema)
		expired(t, pool)
		tx, err := batch.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, pgstore.FirstSQLForTest, firstArgs("n1", "fresh", 60000, 3600000)...); err != nil {
			t.Fatal(err)
		}
		sweepDone := lockWait(t, pool, sweeper, pgstore.DeleteExpiredSQLForTest, 10)
		_, batchErr := tx.Exec(ctx, pgstore.FirstSQLForTest, firstArgs("n2", "fresh", 60000, 3600000)...)
		if batchErr == nil {
			batchErr = tx.Commit(ctx)
		}
		noDeadlock(t, "the batch", batchErr)
		noDeadlock(t, "the sweep", <-sweepDone)
	})

	t.Run("late Finishes of the deleted records", func(t *testing.T) {
		t.Parallel()
		pool, schema := pgtest.Schema(t)
		s := pgstore.New(pool, pgstore.WithoutNotify())
		batch, sweeper := sameShardConns(t, schema)
		expired(t, pool)
		finish := func(ns string) []any {
			var epoch int64
			if err := pool.QueryRow(ctx, "SELECT epoch FROM idemgate_records WHERE namespace = $1", ns).Scan(&epoch); err != nil {
				t.Fatal(err)
			}
			// No quota, no marker, not ResolveOnly.
			return []any{"/pkg.S/M", "old-" + ns, "tok-old-" + ns, epoch, "type.googleapis.com/test.A", []byte("A"), ns, nil, int64(0), nil, nil, nil, false}
		}
		n1, n2 := finish("n1"), finish("n2")
		tx, err := batch.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, s.FinishSQLForTest(), n1...); err != nil {
			t.Fatal(err)
		}
		sweepDone := lockWait(t, pool, sweeper, pgstore.DeleteExpiredSQLForTest, 10)
		_, batchErr := tx.Exec(ctx, s.FinishSQLForTest(), n2...)
		if batchErr == nil {
			batchErr = tx.Commit(ctx)
		}
		noDeadlock(t, "the batch", batchErr)
		noDeadlock(t, "the sweep", <-sweepDone)
		// The sweep passed over the record the batch held (n1, finished by
		// the batch) and deleted the other (n2, whose late Finish then found
		// nothing to finish).
		states := map[string]string{}
		rows, err := pool.Query(ctx, "SELECT namespace, state FROM idemgate_records")
		if err != nil {
			t.Fatal(err)
		}
		var ns, state string
		if _, err := pgx.ForEachRow(rows, []any{&ns, &state}, func() error { states[ns] = state; return nil }); err != nil {
			t.Fatal(err)
		}
		if len(states) != 1 || states["n1"] != "completed" {
			t.Fatalf("records left %v, want only n1, completed: the sweep skips the row the batch holds and deletes the other", states)
		}
	})
}

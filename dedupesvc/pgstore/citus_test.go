//go:build citus

package pgstore_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
	"github.com/idemgate/idemgate/internal/testing/citustest"
	"github.com/idemgate/idemgate/migrations"
)

// TestCitusConformance runs the store's conformance suite against the
// coordinator of a Citus cluster of a coordinator and two workers, each
// test on a schema of its own distributed by migration 013, with waiting
// duplicates woken by a Listener on the coordinator. Before it, on the
// same cluster: an existing single-node schema distributed by Migrate, and
// the usage triggers' changes committed exactly with their rows.
func TestCitusConformance(t *testing.T) {
	c := citustest.New(t, 2)
	t.Run("MigrateDistributesAnExistingSchema", func(t *testing.T) { testCitusMigrateExisting(t, c) })
	t.Run("UsageChangesCommitWithTheirRows", func(t *testing.T) { testCitusUsageTriggers(t, c) })
	t.Run("EpochsComeFromOneSequence", func(t *testing.T) { testCitusEpochs(t, c) })
	t.Run("ListenerOnTheCoordinatorIsWoken", func(t *testing.T) { testCitusListener(t, c) })
	t.Run("BeginTouchesOnlyItsKeysShard", func(t *testing.T) { testCitusBeginOneShard(t, c) })
	t.Run("FreshBeginIsTwoRoundTrips", func(t *testing.T) { testCitusFreshBeginRoundTrips(t, c) })
	t.Run("QuotasReadNoShardsPerBegin", func(t *testing.T) { testCitusQuotasReadNoShards(t, c) })
	storetest.RunWithNotifier(t, func(t *testing.T) dedupesvc.Store {
		pool, schema := c.Schema(t)
		return pgstore.New(pool, pgstore.WithChannel(schema), pgstore.WithCitus())
	}, listener)
}

// testCitusMigrateExisting: a schema migrated while the database had no
// citus (every migration recorded, 013 to 015 having done nothing) holds a
// completed record; Migrate on the Citus coordinator distributes it, and
// the Citus store replays that outcome byte for byte and counts its usage.
func testCitusMigrateExisting(t *testing.T, c *citustest.Cluster) {
	pool, _ := c.EmptySchema(t)
	all, err := migrations.List(migrations.Postgres, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE idemgate_schema_migrations (version bigint PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		for _, m := range all {
			if !strings.HasSuffix(m.Name, "_citus.sql") { // what they did without citus: nothing
				if _, err := tx.Exec(ctx, m.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO idemgate_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the single-node schema: %v", err)
	}
	single := pgstore.New(pool, pgstore.WithoutNotify())
	epoch := mustReserve(t, single)
	outcome := dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.A", Value: []byte("the outcome")}
	if err := single.Finish(ctx, dedupesvc.FinishParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: "t1", Epoch: epoch, Outcome: outcome}); err != nil {
		t.Fatal(err)
	}
	again := []string{"013_citus.sql", "014_worker_start_citus.sql", "015_shard_resume_citus.sql"}
	if pending, err := pgstore.Pending(ctx, pool); err != nil || !slices.Equal(pending, again) {
		t.Fatalf("Pending = %v, %v; want %v again", pending, err, again)
	}
	applied, err := pgstore.Migrate(ctx, pool)
	if err != nil || !slices.Equal(applied, again) {
		t.Fatalf("Migrate = %v, %v; want %v applied again", applied, err, again)
	}
	if citus, err := pgstore.DetectCitus(ctx, pool); err != nil || !citus {
		t.Fatalf("DetectCitus = %v, %v; want the schema distributed", citus, err)
	}
	if applied, err := pgstore.Migrate(ctx, pool); err != nil || len(applied) != 0 {
		t.Fatalf("a second Migrate = %v, %v; want nothing", applied, err)
	}
	s := pgstore.New(pool, pgstore.WithoutNotify(), pgstore.WithCitus())
	res, err := s.Begin(ctx, begin("t2"))
	if err != nil || res.State != dedupesvc.BeginCompleted || !bytes.Equal(res.Outcome.Value, outcome.Value) || res.Outcome.TypeURL != outcome.TypeURL {
		t.Fatalf("Begin after distributing = %+v, %v; want the stored outcome", res, err)
	}
	if _, err := s.CompactUsage(ctx); err != nil {
		t.Fatal(err)
	}
	var records, bytesStored int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(records), 0), coalesce(sum(outcome_bytes), 0) FROM idemgate_namespace_usage`).Scan(&records, &bytesStored); err != nil {
		t.Fatal(err)
	}
	if records != 1 || bytesStored != int64(len(outcome.Value)) {
		t.Fatalf("usage after distributing = %d records, %d bytes; want 1, %d", records, bytesStored, len(outcome.Value))
	}
}

// testCitusUsageTriggers: the usage trigger on a record's shard appends
// its change to the co-located shard of idemgate_usage_changes in the
// row's own transaction: a rolled-back insert leaves no change, a
// committed one exactly one, on the worker holding the row.
func testCitusUsageTriggers(t *testing.T, c *citustest.Cluster) {
	pool, _ := c.Schema(t)
	insert := `INSERT INTO idemgate_records (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch, retention_ms, lease_expires_at, expires_at)
VALUES ('ns', 's', $1, '\x00', 'in_flight', 't', 1, 1000, now(), now())`
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, insert, "rolled-back"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, insert, "committed"); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]int{"rolled-back": 0, "committed": 1} {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idemgate_usage_changes WHERE idempotency_key = $1`, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("key %q: %d usage changes, want %d", key, n, want)
		}
	}
	var sameNode bool
	err = pool.QueryRow(ctx, `
SELECT (SELECT nodeport FROM citus_shards WHERE shardid = get_shard_id_for_distribution_column('idemgate_records', 'committed'))
     = (SELECT nodeport FROM citus_shards WHERE shardid = get_shard_id_for_distribution_column('idemgate_usage_changes', 'committed'))`).Scan(&sameNode)
	if err != nil || !sameNode {
		t.Fatalf("the record's shard and its usage change's shard on one worker = %v, %v; want true", sameNode, err)
	}
}

// testCitusEpochs: fresh keys reserved one after another, on shards of
// both workers, get ever higher epochs, and so do takeovers (an UPDATE's
// epoch): one sequence, on the coordinator, hands out every epoch, never
// one per worker, which would repeat them across workers and could move a
// key's epochs back when its shard moves.
func testCitusEpochs(t *testing.T, c *citustest.Cluster) {
	pool, _ := c.Schema(t)
	s := pgstore.New(pool, pgstore.WithoutNotify(), pgstore.WithCitus())
	var last int64
	for i := range 16 {
		p := begin("t1")
		p.Key = "epoch-" + string(rune('a'+i))
		res, err := s.Begin(ctx, p)
		if err != nil || res.State != dedupesvc.BeginReserved {
			t.Fatalf("Begin %s = %+v, %v", p.Key, res, err)
		}
		if err := s.Release(ctx, dedupesvc.ReleaseParams{Scope: p.Scope, Key: p.Key, AttemptToken: "t1", Epoch: res.Epoch}); err != nil {
			t.Fatal(err)
		}
		again := p
		again.AttemptToken = "t2"
		res2, err := s.Begin(ctx, again) // takes the released key: reserveSQL's UPDATE
		if err != nil || res2.State != dedupesvc.BeginReserved {
			t.Fatalf("Begin %s again = %+v, %v", p.Key, res2, err)
		}
		if res.Epoch <= last || res2.Epoch <= res.Epoch {
			t.Fatalf("key %s: epochs %d then %d after %d; want each above the one before", p.Key, res.Epoch, res2.Epoch, last)
		}
		last = res2.Epoch
	}
	var workers int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT nodeport) FROM citus_shards WHERE table_name = 'idemgate_records'::regclass AND shardid IN (
    SELECT get_shard_id_for_distribution_column('idemgate_records', 'epoch-' || chr(97 + i)) FROM generate_series(0, 15) AS i)`).Scan(&workers); err != nil || workers != 2 {
		t.Fatalf("the keys are on %d workers (%v), want 2", workers, err)
	}
}

// testCitusListener: a Listener on the coordinator is woken when a record
// whose shard is on a worker settles while a duplicate waits for it: the
// Citus store sends the NOTIFY from the coordinator (in the settling
// statement, pg_notify would run on the worker, and nobody listens there).
func testCitusListener(t *testing.T, c *citustest.Cluster) {
	pool, schema := c.Schema(t)
	s := pgstore.New(pool, pgstore.WithChannel(schema), pgstore.WithCitus())
	l := pgstore.NewListener(pool, schema, slog.Default())
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	// The listener connects in the background; keep settling fresh
	// waited-for reservations until one notification arrives (a bounded
	// wait, no timing assertion: it fails only if none is ever delivered).
	deadline := time.After(30 * time.Second)
	for {
		epoch := mustReserve(t, s)
		woken, unsubscribe := l.Subscribe(ctx, dedupesvc.RecordID{Scope: "/pkg.S/M", Key: "key-1"})
		if err := s.Release(ctx, dedupesvc.ReleaseParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: "t1", Epoch: epoch}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-woken:
			unsubscribe()
			return
		case <-time.After(100 * time.Millisecond):
			unsubscribe()
		case <-deadline:
			t.Fatal("no notification arrived within 30s")
		}
	}
}

// testCitusBeginOneShard: a Begin without quotas reads and writes only the
// shards of its key. A transaction on the other worker holds a shard of
// the usage changes locked, and Begins of a fresh key, of a duplicate and
// of a takeover all end. The first statement of a Begin on one PostgreSQL
// (firstSQL) reads the namespace's usage in a CTE: Citus plans it apart,
// across every shard, for every Begin, whether or not it has a quota,
// which under load forked a backend on every worker for each call, and
// here waits for the lock until its context ends.
func testCitusBeginOneShard(t *testing.T, c *citustest.Cluster) {
	pool, schema := c.Schema(t)
	s := pgstore.New(pool, pgstore.WithoutNotify(), pgstore.WithCitus())
	p := begin("t1")
	p.Key = "one-shard"
	home, _ := c.WorkerOf(t, schema, p.Key)
	other := c.Workers[0]
	if other == home {
		other = c.Workers[1]
	}
	var shard string
	if err := pool.QueryRow(ctx, `SELECT shard_name FROM citus_shards WHERE table_name = 'idemgate_usage_changes'::regclass AND nodeport = $1 LIMIT 1`,
		other.Port()).Scan(&shard); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, other.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, stmt := range []string{"SET LOCAL citus.enable_manual_changes_to_shards = on", "LOCK TABLE " + shard + " IN ACCESS EXCLUSIVE MODE"} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	bounded, cancel := context.WithTimeout(ctx, time.Minute) // ample: it fails only if a Begin waits for the lock
	defer cancel()
	res, err := s.Begin(bounded, p)
	if err != nil || res.State != dedupesvc.BeginReserved {
		t.Fatalf("Begin of a fresh key = %+v, %v; want reserved without the other worker's shards", res, err)
	}
	dup := begin("t2")
	dup.Key = p.Key
	if dup, err := s.Begin(bounded, dup); err != nil || dup.State != dedupesvc.BeginInFlight {
		t.Fatalf("a duplicate's Begin = %+v, %v; want in flight without the other worker's shards", dup, err)
	}
	if err := s.Release(bounded, dedupesvc.ReleaseParams{Scope: p.Scope, Key: p.Key, AttemptToken: "t1", Epoch: res.Epoch}); err != nil {
		t.Fatal(err)
	}
	again := begin("t2")
	again.Key = p.Key
	if res, err := s.Begin(bounded, again); err != nil || res.State != dedupesvc.BeginReserved {
		t.Fatalf("Begin of the released key = %+v, %v; want reserved without the other worker's shards", res, err)
	}
}

// testCitusFreshBeginIsTwoRoundTrips: without quotas a fresh key's Begin on
// Citus reads the key and then inserts it, the insert's extra parameters
// (the coordinator's now(), start and resume time) read in the read's round
// trip: two pool round trips, where it took three (issue 38 item 3: each
// write on Citus took up to three). A duplicate's Begin is one.
func testCitusFreshBeginRoundTrips(t *testing.T, c *citustest.Cluster) {
	pool, _ := c.Schema(t)
	s := pgstore.New(pool, pgstore.WithoutNotify(), pgstore.WithCitus())
	for i := range 5 {
		p := begin("t1")
		p.Key = fmt.Sprintf("round-trips-%d", i)
		before := pool.Stat().AcquireCount()
		res, err := s.Begin(ctx, p)
		if err != nil || res.State != dedupesvc.BeginReserved {
			t.Fatalf("Begin of a fresh key = %+v, %v; want reserved", res, err)
		}
		if n := pool.Stat().AcquireCount() - before; n != 2 {
			t.Errorf("a fresh key's Begin took %d round trips of the pool, want 2", n)
		}
		dup := begin("t2")
		dup.Key = p.Key
		before = pool.Stat().AcquireCount()
		if res, err := s.Begin(ctx, dup); err != nil || res.State != dedupesvc.BeginInFlight {
			t.Fatalf("a duplicate's Begin = %+v, %v; want in flight", res, err)
		}
		if n := pool.Stat().AcquireCount() - before; n != 1 {
			t.Errorf("a duplicate's Begin took %d round trips of the pool, want 1", n)
		}
	}
}

// testCitusQuotasReadNoShards: through the Dedupe service with quotas on,
// as its defaults have them, Begins of a caller far below its quotas read
// no usage, and so no shard but their key's; the service reads the
// caller's usage, every shard, about once a second instead. Issue 39: each
// Begin read every shard, and the defaults cost a cluster 11 times the
// calls without quotas.
func testCitusQuotasReadNoShards(t *testing.T, c *citustest.Cluster) {
	_, schema := c.Schema(t)
	pool, counter := tracedPool(t, c.URL(), schema)
	srv := dedupesvc.NewServer(pgstore.New(pool, pgstore.WithoutNotify(), pgstore.WithCitus()), dedupesvc.WithCallerQuota(1_000_000, 1<<30))
	const begins = 60
	reads, bound, elapsed := freshBeginsReadingUsage(t, srv, counter, begins)
	t.Logf("%d fresh Begins in %s read the caller's usage (every shard) %d times", begins, elapsed, reads)
	if reads > bound {
		t.Fatalf("%d fresh Begins far below their quotas read the caller's usage, every shard, %d times in %s; want at most %d", begins, reads, elapsed, bound)
	}
}

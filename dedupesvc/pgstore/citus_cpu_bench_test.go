//go:build citus

package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/citustest"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proccpu"
)

// The benchmarks below measure what a gated call costs the store in CPU,
// per node: a fresh key's Begin and its Finish, one caller, no quota, each
// server's CPU read from /proc before and after (proccpu), so the figures
// hold on a loaded machine where the times do not. They are issue 39's
// instrument: Citus through its coordinator, the same Citus cluster with
// every call sent to the worker holding its key (what routing would cost),
// and one PostgreSQL of the benchmark's own, run side by side:
//
//	go test -tags citus -run '^$' -bench 'FreshFinish|StatementFloor' -benchtime 10s ./dedupesvc/pgstore/

// benchFreshFinish reserves and completes keys[i] per iteration (a fresh
// key of its own when keys is nil) and reports the CPU per call of this
// process and of each server of servers (name to postmaster pid).
func benchFreshFinish(b *testing.B, s *pgstore.Store, keys []string, servers map[string]int) {
	out := dedupesvc.Outcome{TypeURL: "type.googleapis.com/bench.R", Value: []byte("\n\x06charge\x10\x01")}
	run := time.Now().UnixNano()
	read := func() map[string]time.Duration { return readCPU(b, servers) }
	before := read()
	calls := 0
	for b.Loop() {
		p := begin("t1")
		if keys != nil {
			if calls == len(keys) {
				b.Fatalf("%d keys, all used: fewer iterations (-benchtime)", len(keys))
			}
			p.Key = keys[calls]
		} else {
			p.Key = fmt.Sprint("fresh-", run, "-", calls)
		}
		calls++
		res, err := s.Begin(ctx, p)
		if err != nil || res.State != dedupesvc.BeginReserved {
			b.Fatalf("Begin = %+v, %v", res, err)
		}
		if err := s.Finish(ctx, dedupesvc.FinishParams{Namespace: p.Namespace, Scope: p.Scope, Key: p.Key, AttemptToken: "t1", Epoch: res.Epoch, Outcome: out}); err != nil {
			b.Fatal(err)
		}
	}
	after := read()
	for name, used := range after {
		b.ReportMetric((used-before[name]).Seconds()*1000/float64(calls), name+"-cpu-ms/op")
	}
}

// readCPU reads the CPU used so far by this process ("go") and by each
// server of servers (name to postmaster pid).
func readCPU(b *testing.B, servers map[string]int) map[string]time.Duration {
	got := map[string]time.Duration{}
	self, err := proccpu.Proc.ProcessCPU(os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	got["go"] = self
	for name, pm := range servers {
		if got[name], err = proccpu.Proc.ServerCPU(pm); err != nil {
			b.Fatal(err)
		}
	}
	return got
}

// citusServers names the postmasters of c's nodes: coord, w1, w2...
func citusServers(b *testing.B, c *citustest.Cluster) map[string]int {
	servers := map[string]int{}
	for i, node := range append([]*pgtest.Cluster{c.Coordinator}, c.Workers...) {
		pm, err := node.PostmasterPID()
		if err != nil {
			b.Fatal(err)
		}
		name := "coord"
		if i > 0 {
			name = fmt.Sprint("w", i)
		}
		servers[name] = pm
	}
	return servers
}

// BenchmarkCitusFreshFinish is a gated call's Begin and Finish on Citus
// through its coordinator, as the Dedupe service runs them (WithCitus).
func BenchmarkCitusFreshFinish(b *testing.B) {
	c := citustest.New(b, 2)
	pool, _ := c.Schema(b)
	benchFreshFinish(b, pgstore.New(pool, pgstore.WithoutNotify(), pgstore.WithCitus()), nil, citusServers(b, c))
}

// BenchmarkCitusRoutedFreshFinish is BenchmarkCitusFreshFinish with every
// call sent to the worker holding its key's shard, the coordinator left
// out, as a service that routed each call would: the keys are chosen
// beforehand among those of the first worker's shards, and the Store
// connects to that worker, which runs the statements on its local shards
// through Citus's local execution (metadata is synced to the workers).
// Only the epochs' sequence, which lives on the coordinator, is the
// benchmark's own on that worker. It bounds what routing alone can gain.
func BenchmarkCitusRoutedFreshFinish(b *testing.B) {
	c := citustest.New(b, 2)
	_, schema := c.Schema(b)
	coord, err := pgxpool.New(ctx, c.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer coord.Close()
	run := time.Now().UnixNano()
	candidates := make([]string, 200_000)
	for i := range candidates {
		candidates[i] = fmt.Sprint("routed-", run, "-", i)
	}
	rows, err := coord.Query(ctx, `
SELECT k FROM unnest($1::text[]) AS k
WHERE (SELECT nodeport FROM citus_shards AS s WHERE s.shardid = get_shard_id_for_distribution_column($2::regclass, k)) = $3`,
		candidates, schema+".idemgate_records", c.Workers[0].Port())
	if err != nil {
		b.Fatal(err)
	}
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			b.Fatal(err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(c.Workers[0].URL("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	worker, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer worker.Close()
	if _, err := worker.Exec(ctx, "SET citus.enable_ddl_propagation = off; CREATE SEQUENCE idemgate_epochs START 1000000000000"); err != nil {
		b.Fatal(err)
	}
	benchFreshFinish(b, pgstore.New(worker, pgstore.WithoutNotify(), pgstore.WithCitus()), keys, citusServers(b, c))
}

// BenchmarkPostgresFreshFinish is BenchmarkCitusFreshFinish on one
// PostgreSQL of the benchmark's own (durable, as in production), the
// baseline the Citus figures are held to.
func BenchmarkPostgresFreshFinish(b *testing.B) {
	server := pgtest.NewDurableClusterConf(b, "")
	pm, err := server.PostmasterPID()
	if err != nil {
		b.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), server.URL("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pgstore.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	benchFreshFinish(b, pgstore.New(pool, pgstore.WithoutNotify()), nil, map[string]int{"pg": pm})
}

// The statement floor (BenchmarkCitusStatementFloor): the two writes a
// gated call makes at least, a reserving INSERT and a completing UPDATE of
// one record, without the store's guards.
const floorInsertSQL = `INSERT INTO idemgate_records AS r (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch, retention_ms, lease_ms, unknown_retention_ms, lease_expires_at, expires_at)
VALUES ('', '/s', $1, '\x00', 'in_flight', 't', 1, 1000, 1000, 1000, $2::timestamptz, $2::timestamptz) ON CONFLICT (namespace, scope, idempotency_key) DO NOTHING`
const floorUpdateSQL = `UPDATE idemgate_records SET state = 'completed', outcome_type_url = 'x', outcome_value = '\x01' WHERE namespace = '' AND scope = '/s' AND idempotency_key = $1`

// floorFunctionSQL is the two writes in one PL/pgSQL function, which Citus
// delegates to the worker holding k's shard once distributed colocated
// with the records (create_distributed_function); %s is the schema.
const floorFunctionSQL = `CREATE FUNCTION idemgate_floor_call(k text, at timestamptz) RETURNS void LANGUAGE plpgsql SET search_path = %s AS $f$
BEGIN
INSERT INTO idemgate_records AS r (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch, retention_ms, lease_ms, unknown_retention_ms, lease_expires_at, expires_at)
VALUES ('', '/s', k, '\x00', 'in_flight', 't', 1, 1000, 1000, 1000, at, at) ON CONFLICT (namespace, scope, idempotency_key) DO NOTHING;
UPDATE idemgate_records SET state = 'completed', outcome_type_url = 'x', outcome_value = '\x01' WHERE namespace = '' AND scope = '/s' AND idempotency_key = k;
END $f$`

// runStatementFloor writes a fresh key per iteration, as two statements or
// one delegated call, and reports the CPU per call of this process and of
// each server.
func runStatementFloor(b *testing.B, pool *pgxpool.Pool, delegated bool, servers map[string]int) {
	read := func() map[string]time.Duration { return readCPU(b, servers) }
	run := time.Now().UnixNano()
	before := read()
	calls := 0
	for b.Loop() {
		k := fmt.Sprint("e-", run, "-", calls)
		calls++
		now := time.Now()
		if delegated {
			if _, err := pool.Exec(ctx, "SELECT idemgate_floor_call($1, $2)", k, now); err != nil {
				b.Fatal(err)
			}
			continue
		}
		if _, err := pool.Exec(ctx, floorInsertSQL, k, now); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, floorUpdateSQL, k); err != nil {
			b.Fatal(err)
		}
	}
	after := read()
	for n, u := range after {
		b.ReportMetric((u-before[n]).Seconds()*1000/float64(calls), n+"-cpu-ms/op")
	}
}

// BenchmarkCitusStatementFloor is what Citus costs per statement, apart
// from the store's own statements: the floor's two writes through the
// coordinator, as one delegated function call, and without the usage
// triggers (whose INSERT into idemgate_usage_changes is itself planned by
// Citus on the worker), beside the same on one PostgreSQL.
func BenchmarkCitusStatementFloor(b *testing.B) {
	c := citustest.New(b, 2)
	pool, schema := c.Schema(b)
	if _, err := pool.Exec(ctx, fmt.Sprintf(floorFunctionSQL, schema)); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "SELECT create_distributed_function('idemgate_floor_call(text,timestamptz)', 'k', colocate_with := 'idemgate_records')"); err != nil {
		b.Fatal(err)
	}
	servers := citusServers(b, c)
	b.Run("citus-direct", func(b *testing.B) { runStatementFloor(b, pool, false, servers) })
	b.Run("citus-delegated", func(b *testing.B) { runStatementFloor(b, pool, true, servers) })
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{"SET citus.enable_unsafe_triggers = on", "DROP TRIGGER idemgate_records_usage_rows ON idemgate_records", "DROP TRIGGER idemgate_records_usage_bytes ON idemgate_records"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	conn.Release()
	b.Run("citus-direct-notrigger", func(b *testing.B) { runStatementFloor(b, pool, false, servers) })
	server := pgtest.NewDurableClusterConf(b, "")
	pm, _ := server.PostmasterPID()
	pg, err := pgxpool.New(ctx, server.URL("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer pg.Close()
	if _, err := pgstore.Migrate(ctx, pg); err != nil {
		b.Fatal(err)
	}
	if _, err := pg.Exec(ctx, fmt.Sprintf(floorFunctionSQL, "public")); err != nil {
		b.Fatal(err)
	}
	b.Run("pg-direct", func(b *testing.B) { runStatementFloor(b, pg, false, map[string]int{"pg": pm}) })
	b.Run("pg-function", func(b *testing.B) { runStatementFloor(b, pg, true, map[string]int{"pg": pm}) })
	for _, q := range []string{"DROP TRIGGER idemgate_records_usage_rows ON idemgate_records", "DROP TRIGGER idemgate_records_usage_bytes ON idemgate_records"} {
		if _, err := pg.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("pg-direct-notrigger", func(b *testing.B) { runStatementFloor(b, pg, false, map[string]int{"pg": pm}) })
}

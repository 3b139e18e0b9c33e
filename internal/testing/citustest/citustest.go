// Package citustest starts throwaway Citus clusters for tests: a
// coordinator and workers, each a PostgreSQL server of its own
// (pgtest.NewClusterConf) with the citus extension preloaded, on loopback,
// removed when the test ends.
//
// Citus is not shipped with the project: ../shared/citus/build.sh builds
// and installs it into the machine's PostgreSQL. Without it a test skips,
// except under CI=true, where it fails.
package citustest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// ShardCount is the number of shards each distributed table gets on the
// clusters New starts: 4, two per worker of a two-worker cluster, so keys
// land on both workers while each test schema stays cheap to create (the
// default, 32, costs every schema 64 shard tables).
const ShardCount = 4

// setupTimeout bounds the statements that build or tear down a cluster or
// a schema; generous, the machine is shared and loaded.
const setupTimeout = 2 * time.Minute

// Cluster is a Citus coordinator and its workers.
type Cluster struct {
	// Coordinator is the node clients connect to; it holds the reference
	// tables' copy and the metadata, and plans every query.
	Coordinator *pgtest.Cluster
	// Workers hold the shards of the distributed tables.
	Workers []*pgtest.Cluster
}

// New starts a coordinator and workers workers, creates the citus
// extension in database postgres on each, registers the coordinator
// (citus_set_coordinator_host) and adds the workers (citus_add_node). Every
// node is stopped and removed when the test ends.
func New(tb testing.TB, workers int) *Cluster {
	tb.Helper()
	return NewSharded(tb, workers, ShardCount)
}

// NewSharded is New with shards shards per distributed table: 32, Citus's
// default, is the cluster docs/operating.md sets up.
func NewSharded(tb testing.TB, workers, shards int) *Cluster {
	tb.Helper()
	requireCitus(tb)
	conf := fmt.Sprintf("shared_preload_libraries = 'citus'\ncitus.shard_count = %d\nmax_connections = 200\n", shards)
	c := &Cluster{Coordinator: pgtest.NewClusterConf(tb, conf)}
	for range workers {
		c.Workers = append(c.Workers, pgtest.NewClusterConf(tb, conf))
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	for _, n := range append([]*pgtest.Cluster{c.Coordinator}, c.Workers...) {
		exec(ctx, tb, n.URL("postgres"), "CREATE EXTENSION IF NOT EXISTS citus")
	}
	exec(ctx, tb, c.URL(), fmt.Sprintf("SELECT citus_set_coordinator_host('127.0.0.1', %d)", c.Coordinator.Port()))
	for _, w := range c.Workers {
		exec(ctx, tb, c.URL(), fmt.Sprintf("SELECT citus_add_node('127.0.0.1', %d)", w.Port()))
	}
	return c
}

// URL returns the URL of database postgres on the coordinator.
func (c *Cluster) URL() string { return c.Coordinator.URL("postgres") }

// requireCitus skips the test (fails it under CI=true) unless citus.so is
// installed in the server's library directory.
func requireCitus(tb testing.TB) {
	tb.Helper()
	lib, err := pgtest.LibDir()
	if err == nil {
		_, err = os.Stat(filepath.Join(lib, "citus.so"))
	}
	if err != nil {
		msg := fmt.Sprintf("citustest: Citus is not installed (%v); run bash ../shared/citus/build.sh", err)
		if os.Getenv("CI") == "true" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
}

func exec(ctx context.Context, tb testing.TB, url, sql string) {
	tb.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("citustest: connect %s: %v", url, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		tb.Fatalf("citustest: %s: %v", sql, err)
	}
}

var (
	schemas atomic.Int64
	// ddlMu runs one test's schema DDL (create, migrate, drop) at a time:
	// Citus propagates each to every node, and two at once can deadlock
	// across nodes.
	ddlMu sync.Mutex
)

// EmptySchema creates a schema on the coordinator (Citus creates it on the
// workers too) and returns a pool of 16 connections whose search_path is
// that schema, and its name. The schema is dropped, with its shards, when
// the test ends.
func (c *Cluster) EmptySchema(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	schema := fmt.Sprintf("citustest_%d_%d", os.Getpid(), schemas.Add(1))
	ddlMu.Lock()
	exec(ctx, tb, c.URL(), "CREATE SCHEMA "+schema)
	ddlMu.Unlock()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		ddlMu.Lock()
		defer ddlMu.Unlock()
		exec(ctx, tb, c.URL(), "DROP SCHEMA "+schema+" CASCADE")
	})
	return c.OpenPool(tb, schema), schema
}

// Schema is EmptySchema migrated (pgstore.Migrate), so its tables are
// distributed.
func (c *Cluster) Schema(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	pool, schema := c.EmptySchema(tb)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	ddlMu.Lock()
	defer ddlMu.Unlock()
	if _, err := pgstore.Migrate(ctx, pool); err != nil {
		tb.Fatalf("citustest: migrate: %v", err)
	}
	return pool, schema
}

// OpenPool opens a pool of 16 connections to the coordinator whose
// search_path is schema; it is closed when the test ends.
func (c *Cluster) OpenPool(tb testing.TB, schema string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(c.URL())
	if err != nil {
		tb.Fatalf("citustest: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("citustest: open pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// Placements returns, for each distributed or reference table of schema,
// the ports of the nodes holding its shards, as "table:port" strings in
// order, so a test can see the shards spread over the workers.
func (c *Cluster) Placements(tb testing.TB, schema string) []string {
	tb.Helper()
	ctx, conn, done := c.connect(tb)
	defer done()
	rows, err := conn.Query(ctx, `
SELECT DISTINCT s.table_name::text || ':' || s.nodeport::text
FROM citus_shards AS s
WHERE s.table_name::text LIKE $1 || '.%'
ORDER BY 1`, schema)
	if err != nil {
		tb.Fatalf("citustest: %v", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatalf("citustest: %v", err)
	}
	for i, s := range out {
		out[i] = strings.TrimPrefix(s, schema+".")
	}
	return out
}

// WorkerOf returns the worker holding the shard of schema's
// idemgate_records that key hashes to, and that shard's id.
func (c *Cluster) WorkerOf(tb testing.TB, schema, key string) (*pgtest.Cluster, int64) {
	tb.Helper()
	ctx, conn, done := c.connect(tb)
	defer done()
	var (
		shard int64
		port  int
	)
	err := conn.QueryRow(ctx, `
SELECT s.shardid, s.nodeport FROM citus_shards AS s
WHERE s.shardid = get_shard_id_for_distribution_column($1::regclass, $2::text)`, schema+".idemgate_records", key).Scan(&shard, &port)
	if err != nil {
		tb.Fatalf("citustest: the shard of key %q: %v", key, err)
	}
	for _, w := range c.Workers {
		if w.Port() == port {
			return w, shard
		}
	}
	tb.Fatalf("citustest: the shard %d of key %q is on port %d, no worker's", shard, key, port)
	return nil, 0
}

// connect opens a connection to the coordinator for one of the helpers
// above, bounded by setupTimeout: done closes it and ends the context.
func (c *Cluster) connect(tb testing.TB) (context.Context, *pgx.Conn, func()) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		cancel()
		tb.Fatalf("citustest: %v", err)
	}
	return ctx, conn, func() {
		conn.Close(context.Background())
		cancel()
	}
}

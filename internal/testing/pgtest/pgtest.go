// Package pgtest gives each test its own migrated PostgreSQL schema on the
// local server, so tests run in parallel and leave nothing behind.
//
// The server is IDEMGATE_TEST_DATABASE_URL, or the local one at
// postgres://postgres@127.0.0.1:5432/postgres. When it cannot be reached a
// test skips, except under CI=true, where it fails: CI must never pass by
// skipping the store.
//
// A schema still there after its test's cleanups fails that test; one left
// by a test process that was killed before its cleanups ran is dropped by
// the next process's first Schema, which says so (and fails under CI=true).
//
// NewCluster is for the tests that must stop or crash PostgreSQL itself: it
// starts a throwaway server of the test's own, never the shared one.
// NewReplicatedCluster starts a throwaway primary with a synchronous
// streaming standby, for failover tests.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc/pgstore"
)

// DefaultURL is the server tests use when IDEMGATE_TEST_DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// URL returns the server URL tests use.
func URL() string {
	if u := os.Getenv("IDEMGATE_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Schema creates a fresh, migrated schema and returns a pool whose
// connections use it, plus the schema's name. Both are gone when the test
// ends.
func Schema(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	pool, schema := EmptySchema(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pgstore.Migrate(ctx, pool); err != nil {
		tb.Fatalf("pgtest: migrate: %v", err)
	}
	return pool, schema
}

// EmptySchema is Schema without the migrations, for tests that write a
// schema as an earlier version left it (upgrade tests).
func EmptySchema(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	admin, err := pgx.Connect(ctx, URL())
	if err != nil {
		unreachable(tb, err)
	}
	defer admin.Close(ctx)

	reapOnce.Do(func() { reapSchemas(tb, admin, schemaPrefix) })
	schema := schemaName(ownPrefix)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatalf("pgtest: create schema: %v", err)
	}
	// Registered first, so it runs last: after the pools (OpenPool's
	// cleanups) are closed, the schema is dropped, then checked gone.
	tb.Cleanup(func() {
		dropSchema(tb, schema)
		checkDropped(tb, schema)
	})
	return OpenPool(tb, schema), schema
}

// OpenPool opens one more pool on schema, as a second dedupe service replica
// would, of 16 connections; it is closed when the test ends.
func OpenPool(tb testing.TB, schema string) *pgxpool.Pool {
	tb.Helper()
	return OpenPoolSize(tb, schema, 16)
}

// OpenPoolSize is OpenPool with maxConns connections at most, for
// benchmarks that size the pool.
func OpenPoolSize(tb testing.TB, schema string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		tb.Fatalf("pgtest: parse %s: %v", URL(), err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: open pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// Pool is Schema without the schema's name.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, _ := Schema(tb)
	return pool
}

func dropSchema(tb testing.TB, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		tb.Errorf("pgtest: drop schema %s: %v", schema, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
		tb.Errorf("pgtest: drop schema %s: %v", schema, err)
	}
}

func unreachable(tb testing.TB, err error) {
	tb.Helper()
	unavailable(tb, fmt.Sprintf("pgtest: PostgreSQL at %s is unreachable: %v (start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start)", URL(), err))
}

// SchemaURL creates a fresh, migrated schema like Schema and returns a
// connection URL that selects it, for code that opens its own pool.
func SchemaURL(tb testing.TB) string {
	tb.Helper()
	_, schema := Schema(tb)
	return schemaURL(schema)
}

// EmptySchemaURL is EmptySchema as a connection URL that selects the
// schema, for a process that opens its own pool; it returns the schema's
// name too.
func EmptySchemaURL(tb testing.TB) (url, schema string) {
	tb.Helper()
	_, schema = EmptySchema(tb)
	return schemaURL(schema), schema
}

// schemaURL is URL with the search_path that selects schema.
func schemaURL(schema string) string {
	sep := "?"
	if strings.Contains(URL(), "?") {
		sep = "&"
	}
	return URL() + sep + "search_path=" + schema
}

package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// MigrationHold holds back pgstore.Migrate on one empty schema: a
// transaction of the test's has created the migrations table
// (idemgate_schema_migrations) and not committed, so a migrator finds no
// table and waits to create its own until Release rolls the test's back.
// Nothing of the hold is left in the schema.
type MigrationHold struct {
	conn *pgx.Conn
	tx   pgx.Tx
}

// HoldMigrations holds back the migrations of schema, which must be empty,
// until Release or the end of the test.
func HoldMigrations(tb testing.TB, schema string) *MigrationHold {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		unreachable(tb, err)
	}
	h := &MigrationHold{conn: conn}
	// Registered after EmptySchema's cleanup, so it runs before the schema
	// is dropped.
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = conn.Close(ctx) // rolls back a hold not released
	})
	if h.tx, err = conn.Begin(ctx); err != nil {
		tb.Fatalf("pgtest: hold migrations: %v", err)
	}
	// The columns do not matter: the table is rolled back, never used.
	if _, err := h.tx.Exec(ctx, "CREATE TABLE "+pgx.Identifier{schema, "idemgate_schema_migrations"}.Sanitize()+" (version bigint)"); err != nil {
		tb.Fatalf("pgtest: hold migrations: %v", err)
	}
	return h
}

// Waiters returns how many other sessions wait for the hold: a migrator
// creating the migrations table.
func (h *MigrationHold) Waiters(ctx context.Context) (int, error) {
	var n int
	// pg_locks, not pg_stat_activity: a transaction reads the latter once
	// and keeps what it read.
	err := h.tx.QueryRow(ctx, `SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted AND pg_backend_pid() = ANY (pg_blocking_pids(pid))`).Scan(&n)
	return n, err
}

// Release rolls the hold back: a waiting migrator goes on and applies every
// migration.
func (h *MigrationHold) Release(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.tx.Rollback(ctx); err != nil {
		tb.Fatalf("pgtest: release the migrations: %v", err)
	}
}

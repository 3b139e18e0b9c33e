package sqlitestore_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
)

// TestBatchedDuplicates holds SQLite's write lock from a second connection,
// so that Begins of the same keys queue behind the store's writer and are
// written in one transaction.
func TestBatchedDuplicates(t *testing.T) {
	t.Parallel()
	s, hooks := batched(t)
	storetest.RunBatchedDuplicates(t, s, hooks)
}

// TestBatchedFailures puts a Begin over its namespace's quota into one
// transaction with ten good Begins: it must get its quota error, and they
// their reservations.
func TestBatchedFailures(t *testing.T) {
	t.Parallel()
	s, hooks := batched(t)
	storetest.RunBatchedFailures(t, s, hooks, nil)
}

// batched returns a store and the hooks that hold its writer: SQLite's
// write lock, taken from a second connection.
func batched(t *testing.T) (*sqlitestore.Store, storetest.BatchHooks) {
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, storetest.BatchHooks{
		Hold: func(t *testing.T) func() {
			db, err := sql.Open("sqlite", "file:"+s.Path()+"?_pragma=busy_timeout(10000)")
			if err != nil {
				t.Fatal(err)
			}
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
				t.Fatal(err)
			}
			return func() {
				_, _ = conn.ExecContext(ctx, `ROLLBACK`)
				_ = conn.Close()
				_ = db.Close()
			}
		},
		Queued:  s.QueuedForTest,
		Writing: s.WritingForTest,
		Stats:   s.GroupCommitStats,
	}
}

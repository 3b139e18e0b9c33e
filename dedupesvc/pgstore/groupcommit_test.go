package pgstore_test

import (
	"testing"

	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
	"github.com/idemgate/idemgate/internal/pgtest"
)

// TestBatchedDuplicates holds the table lock from outside, so that Begins
// of the same keys queue behind the one writer and are written as one
// pgx.Batch in one transaction.
func TestBatchedDuplicates(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	s := pgstore.New(pool, pgstore.WithChannel(schema), pgstore.WithGroupCommit(pgstore.GroupCommit{MaxBatch: 64, Writers: 1}))
	locker := pgtest.OpenPool(t, schema)
	storetest.RunBatchedDuplicates(t, s, storetest.BatchHooks{
		Hold: func(t *testing.T) func() {
			tx, err := locker.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// Blocks every INSERT and UPDATE of the records, not their reads.
			if _, err := tx.Exec(ctx, `LOCK TABLE idemgate_records IN SHARE ROW EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			return func() { _ = tx.Rollback(ctx) }
		},
		Queued:  s.QueuedForTest,
		Writing: s.WritingForTest,
		Stats:   s.GroupCommitStats,
	})
}

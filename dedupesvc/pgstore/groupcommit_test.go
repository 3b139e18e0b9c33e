package pgstore_test

import (
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// TestBatchedDuplicates holds the table lock from outside, so that Begins
// of the same keys queue behind the one writer and are written as one
// pgx.Batch in one transaction.
func TestBatchedDuplicates(t *testing.T) {
	t.Parallel()
	s, hooks := batched(t)
	storetest.RunBatchedDuplicates(t, s, hooks)
}

// TestBatchedFailures puts a Finish the schema refuses (a completed record
// without an outcome value breaks idemgate_records_outcome_check, which
// aborts the whole batch's transaction) and a Begin over its quota into one
// batch with ten good Begins: each must get its own answer.
func TestBatchedFailures(t *testing.T) {
	t.Parallel()
	s, hooks := batched(t)
	held := begin("bad-holder")
	held.Key = "bad"
	r, err := s.Begin(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	storetest.RunBatchedFailures(t, s, hooks, func() error {
		return s.Finish(ctx, dedupesvc.FinishParams{Scope: held.Scope, Key: "bad", AttemptToken: "bad-holder", Epoch: r.Epoch,
			Outcome: dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.A", Value: nil}})
	})
}

// batched returns a store with one group commit writer, and the hooks that
// hold it: the table lock, taken from outside, blocks its writes.
func batched(t *testing.T) (*pgstore.Store, storetest.BatchHooks) {
	pool, schema := pgtest.Schema(t)
	s := pgstore.New(pool, pgstore.WithChannel(schema), pgstore.WithGroupCommit(pgstore.GroupCommit{MaxBatch: 64, Writers: 1}))
	locker := pgtest.OpenPool(t, schema)
	return s, storetest.BatchHooks{
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
	}
}

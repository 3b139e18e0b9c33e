package pgstore_test

import (
	"testing"

	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// BenchmarkStoreNoGroupCommit is BenchmarkStore with group commit off: each
// statement its own transaction.
func BenchmarkStoreNoGroupCommit(b *testing.B) {
	pool, _ := pgtest.Schema(b)
	storetest.Bench(b, pgstore.New(pool, pgstore.WithGroupCommit(pgstore.GroupCommit{MaxBatch: 1})))
}

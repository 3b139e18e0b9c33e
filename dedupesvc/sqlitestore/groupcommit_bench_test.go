package sqlitestore_test

import (
	"context"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
)

// BenchmarkStoreNoGroupCommit is BenchmarkStore with group commit off: each
// statement its own transaction.
func BenchmarkStoreNoGroupCommit(b *testing.B) {
	s, err := sqlitestore.Open(context.Background(), b.TempDir(), sqlitestore.WithGroupCommit(sqlitestore.GroupCommit{MaxBatch: 1}))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.Bench(b, s)
}

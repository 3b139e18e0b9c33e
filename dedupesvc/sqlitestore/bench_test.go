package sqlitestore_test

import (
	"context"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
)

// BenchmarkStore is storetest.Bench on the embedded store.
func BenchmarkStore(b *testing.B) {
	s, err := sqlitestore.Open(context.Background(), b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.Bench(b, s)
}

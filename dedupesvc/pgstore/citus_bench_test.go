//go:build citus

package pgstore_test

import (
	"testing"

	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/citustest"
)

// BenchmarkCitusBeginFresh is BenchmarkBeginFresh on the coordinator of a
// coordinator and two workers (citustest, 4 shards per table), without
// quotas: one caller, so each Begin's time is its round trips'.
func BenchmarkCitusBeginFresh(b *testing.B) {
	c := citustest.New(b, 2)
	pool, _ := c.Schema(b)
	benchBeginFresh(b, pgstore.New(pool, pgstore.WithoutNotify(), pgstore.WithCitus()))
}

//go:build citus

package pgstore_test

import (
	"fmt"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/citustest"
)

// BenchmarkCitusBeginFresh is BenchmarkBeginFresh on the coordinator of a
// coordinator and two workers (citustest, 4 shards per table), without
// quotas: one caller, so each Begin's time is its round trips'.
func BenchmarkCitusBeginFresh(b *testing.B) {
	c := citustest.New(b, 2)
	pool, _ := c.Schema(b)
	s := pgstore.New(pool, pgstore.WithoutNotify(), pgstore.WithCitus())
	i := 0
	for b.Loop() {
		p := begin("t1")
		p.Key = fmt.Sprint("key-", i)
		i++
		if res, err := s.Begin(ctx, p); err != nil || res.State != dedupesvc.BeginReserved {
			b.Fatalf("Begin = %+v, %v", res, err)
		}
	}
}

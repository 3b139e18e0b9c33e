package pgstore_test

import (
	"fmt"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// BenchmarkAddReplays measures one flush of the replay recorder: one
// statement adding counts to 1,000 completed records.
func BenchmarkAddReplays(b *testing.B) {
	pool, _ := pgtest.Schema(b)
	s := pgstore.New(pool)
	counts := make([]dedupesvc.ReplayCount, 1000)
	for i := range counts {
		p := begin("t1")
		p.Key = fmt.Sprint("key-", i)
		res, err := s.Begin(ctx, p)
		if err != nil || res.State != dedupesvc.BeginReserved {
			b.Fatalf("Begin = %+v, %v", res, err)
		}
		if err := s.Finish(ctx, dedupesvc.FinishParams{Scope: p.Scope, Key: p.Key, AttemptToken: "t1", Epoch: res.Epoch,
			Outcome: dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.A", Value: []byte("A")}}); err != nil {
			b.Fatal(err)
		}
		r, _, err := s.GetRecord(ctx, p.ID())
		if err != nil {
			b.Fatal(err)
		}
		counts[i] = dedupesvc.ReplayCount{ID: p.ID(), CompletedAt: r.CompletedAt, Count: 1}
	}
	b.ResetTimer()
	for b.Loop() {
		if n, err := s.AddReplays(ctx, counts); err != nil || n != len(counts) {
			b.Fatalf("AddReplays = %d, %v", n, err)
		}
	}
}

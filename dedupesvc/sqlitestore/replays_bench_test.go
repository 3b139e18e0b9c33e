package sqlitestore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
)

// BenchmarkAddReplays measures one flush of the replay recorder: one
// statement adding counts to 1,000 completed records.
func BenchmarkAddReplays(b *testing.B) {
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	counts := make([]dedupesvc.ReplayCount, 1000)
	for i := range counts {
		p := dedupesvc.BeginParams{Scope: "/pkg.S/M", Key: fmt.Sprint("key-", i), Fingerprint: make([]byte, 32), AttemptToken: "t1", Lease: time.Hour, Retention: time.Hour}
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

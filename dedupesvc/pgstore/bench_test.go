package pgstore_test

import (
	"fmt"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// BenchmarkBeginReplay measures the read every duplicate Begin costs: the key
// is completed, so each Begin is one read and no write.
func BenchmarkBeginReplay(b *testing.B) {
	pool, _ := pgtest.Schema(b)
	s := pgstore.New(pool)
	res, err := s.Begin(ctx, begin("t1"))
	if err != nil || res.State != dedupesvc.BeginReserved {
		b.Fatalf("Begin = %+v, %v", res, err)
	}
	if err := s.Finish(ctx, dedupesvc.FinishParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: "t1", Epoch: res.Epoch,
		Outcome: dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.A", Value: []byte("A")}}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if res, err := s.Begin(ctx, begin("t2")); err != nil || res.State != dedupesvc.BeginCompleted {
			b.Fatalf("Begin = %+v, %v", res, err)
		}
	}
}

// BenchmarkBeginFresh measures a Begin on a new key: one read and the
// reserving upsert.
func BenchmarkBeginFresh(b *testing.B) {
	pool, _ := pgtest.Schema(b)
	benchBeginFresh(b, pgstore.New(pool))
}

// benchBeginFresh reserves a fresh key of s per iteration, one caller.
func benchBeginFresh(b *testing.B, s *pgstore.Store) {
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

// BenchmarkStore is storetest.Bench on PostgreSQL, with a pool of 16
// connections (the Dedupe service's default).
func BenchmarkStore(b *testing.B) {
	pool, _ := pgtest.Schema(b)
	storetest.Bench(b, pgstore.New(pool))
}

// BenchmarkReleaseLost frees a gate's follow-up batch (256 lost attempts,
// each holding its reservation) in one ReleaseLost: one round trip and one
// commit. The reservations are made outside the timer. Per op: one batch;
// the time to free a crowd of n is about n/256 ops (two in flight at once
// per Gate).
func BenchmarkReleaseLost(b *testing.B) {
	const batch = 256
	pool, _ := pgtest.Schema(b)
	s := pgstore.New(pool)
	round := 0
	for b.Loop() {
		b.StopTimer()
		attempts := make([]dedupesvc.LostAttempt, batch)
		for i := range attempts {
			p := begin(fmt.Sprint("lost-", round, "-", i))
			p.Key = fmt.Sprint("key-", round, "-", i)
			if res, err := s.Begin(ctx, p); err != nil || res.State != dedupesvc.BeginReserved {
				b.Fatalf("Begin = %+v, %v", res, err)
			}
			attempts[i] = dedupesvc.LostAttempt{Scope: p.Scope, Key: p.Key, AttemptToken: p.AttemptToken}
		}
		round++
		b.StartTimer()
		if n, err := s.ReleaseLost(ctx, dedupesvc.ReleaseLostParams{Attempts: attempts}); err != nil || n != batch {
			b.Fatalf("ReleaseLost = %d, %v; want %d", n, err, batch)
		}
	}
}

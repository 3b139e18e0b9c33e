package storetest

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
)

// BenchConcurrency are the numbers of concurrent callers Bench measures.
var BenchConcurrency = []int{1, 16, 64}

// benchSeq numbers keys across every round of every benchmark: b.Run calls a
// benchmark several times while it sizes b.N, and a fresh key must never
// meet a key of an earlier round.
var benchSeq atomic.Int64

// Bench measures a store's Begin, in process, at each of BenchConcurrency
// callers: "fresh" reserves a new key each call, "replay" asks for a key
// already completed (a duplicate), "fresh+finish" reserves a new key and
// stores its outcome (what a gated call costs the store). Per-operation time
// at c callers is the inverse of throughput: 1e9/ns_per_op operations a
// second.
func Bench(b *testing.B, s dedupesvc.Store) {
	ctx := context.Background()
	fp := fingerprint("bench")
	out := dedupesvc.Outcome{TypeURL: "type.googleapis.com/bench.R", Value: []byte("\n\x06charge\x10\x01")}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	params := func(key, token string) dedupesvc.BeginParams {
		return dedupesvc.BeginParams{Namespace: "bench", Scope: "/bench.S/M", Key: key, Fingerprint: fp, AttemptToken: token,
			Lease: time.Minute, Retention: time.Hour, UnknownRetention: time.Hour,
			// The Dedupe service's default quotas, so the usage read is measured.
			MaxRecords: dedupesvc.DefaultCallerRecords, MaxOutcomeBytes: dedupesvc.DefaultCallerBytes}
	}
	done := params("replayed-"+run, "holder")
	r, err := s.Begin(ctx, done)
	if err != nil || r.State != dedupesvc.BeginReserved {
		b.Fatalf("Begin = %+v, %v", r, err)
	}
	if err := s.Finish(ctx, dedupesvc.FinishParams{Namespace: "bench", Scope: done.Scope, Key: done.Key, AttemptToken: "holder", Epoch: r.Epoch, Outcome: out}); err != nil {
		b.Fatal(err)
	}
	ops := []struct {
		name string
		op   func(n int64) error
	}{
		{"fresh", func(n int64) error {
			key := fmt.Sprintf("fresh-%s-%d", run, n)
			res, err := s.Begin(ctx, params(key, key))
			if err == nil && res.State != dedupesvc.BeginReserved {
				err = fmt.Errorf("Begin = %v, want reserved", res.State)
			}
			return err
		}},
		{"replay", func(n int64) error {
			res, err := s.Begin(ctx, params(done.Key, "dup-"+strconv.FormatInt(n, 10)))
			if err == nil && res.State != dedupesvc.BeginCompleted {
				err = fmt.Errorf("Begin = %v, want completed", res.State)
			}
			return err
		}},
		{"fresh+finish", func(n int64) error {
			key := fmt.Sprintf("finished-%s-%d", run, n)
			res, err := s.Begin(ctx, params(key, key))
			if err != nil {
				return err
			}
			if res.State != dedupesvc.BeginReserved {
				return fmt.Errorf("Begin = %v, want reserved", res.State)
			}
			return s.Finish(ctx, dedupesvc.FinishParams{Namespace: "bench", Scope: "/bench.S/M", Key: key, AttemptToken: key, Epoch: res.Epoch, Outcome: out})
		}},
	}
	for _, o := range ops {
		for _, c := range BenchConcurrency {
			b.Run(fmt.Sprintf("%s/c=%d", o.name, c), func(b *testing.B) { parallel(b, c, o.op) })
		}
	}
}

// parallel runs op b.N times over c goroutines.
func parallel(b *testing.B, c int, op func(n int64) error) {
	if c == 1 {
		for b.Loop() {
			if err := op(benchSeq.Add(1)); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	// RunParallel starts GOMAXPROCS × parallelism goroutines.
	b.SetParallelism(max(1, c/max(1, runtimeProcs())))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(benchSeq.Add(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

package interceptor_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// The benchmarks run the whole stack on this machine: a client, the gated
// tool server, the Dedupe service and PostgreSQL, all over loopback. Compare
// them as ratios within one run (make bench), never as absolute times.

var concurrencies = []int{1, 64}

// discard is the benchmarks' logger: a log line printed into a benchmark's
// result line makes benchstat drop the sample.
var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// bench is the stack of every benchmark: quiet, and with no Begin rate
// limit at the Dedupe service (its default of 500 a second would refuse
// the concurrent rows).
func bench(cfg stacktest.Config) stacktest.Config {
	cfg.GateOptions = append(cfg.GateOptions, interceptor.WithLogger(discard))
	cfg.DedupeOptions = append(cfg.DedupeOptions, dedupesvc.WithCallerRate(0, 0))
	return cfg
}

// benchSeq numbers operations across every round of every benchmark: b.Run
// calls a benchmark several times while it sizes b.N, and a fresh-key
// benchmark must never meet a key of an earlier round.
var benchSeq atomic.Int64

// parallel runs op b.N times over c goroutines; op gets a number unique
// across the test binary.
func parallel(b *testing.B, c int, op func(n int64) error) {
	seq := &benchSeq
	if c == 1 {
		for b.Loop() {
			if err := op(seq.Add(1)); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.SetParallelism((c + 1) / 2) // RunParallel starts GOMAXPROCS × parallelism goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(seq.Add(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkUngatedCall(b *testing.B) {
	h := setupWith(b, bench(stacktest.Config{}))
	req := &testingv1.MutateRequest{Payload: "read"}
	for _, c := range concurrencies {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			parallel(b, c, func(int64) error {
				_, err := h.client.Read(context.Background(), req)
				return err
			})
		})
	}
}

func BenchmarkGatedFreshKey(b *testing.B) {
	benchmarkFreshKey(b, setupWith(b, bench(stacktest.Config{})), "fresh")
}

// BenchmarkGatedFreshKeyAfterReply is GatedFreshKey on a method with
// finish: FINISH_POLICY_AFTER_REPLY: the caller is answered before the
// outcome is stored, and the Finish runs in the background, overlapping the
// next calls.
func BenchmarkGatedFreshKeyAfterReply(b *testing.B) {
	h := setupWith(b, bench(stacktest.Config{}))
	benchmarkFreshKeyOn(b, h.client.MutateAfterReply, "fresh-after-reply")
}

func benchmarkFreshKey(b *testing.B, h *harness, prefix string) {
	benchmarkFreshKeyOn(b, h.client.Mutate, prefix)
}

func benchmarkFreshKeyOn(b *testing.B, call func(context.Context, *testingv1.MutateRequest, ...grpc.CallOption) (*testingv1.MutateResponse, error), prefix string) {
	req := &testingv1.MutateRequest{Payload: "charge"}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, c := range concurrencies {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			parallel(b, c, func(n int64) error {
				ctx := metadata.AppendToOutgoingContext(context.Background(), idemgate.KeyHeader, fmt.Sprintf("%s-%s-%d-%d", prefix, run, c, n))
				_, err := call(ctx, req)
				return err
			})
		})
	}
}

func BenchmarkGatedReplay(b *testing.B) {
	benchmarkReplay(b, setupWith(b, bench(stacktest.Config{})), "replayed")
}

func benchmarkReplay(b *testing.B, h *harness, key string) {
	req := &testingv1.MutateRequest{Payload: "charge"}
	ctx := metadata.AppendToOutgoingContext(context.Background(), idemgate.KeyHeader, key)
	if _, err := h.client.Mutate(ctx, req); err != nil {
		b.Fatal(err)
	}
	for _, c := range concurrencies {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			parallel(b, c, func(int64) error {
				_, err := h.client.Mutate(ctx, req)
				return err
			})
		})
	}
}

// BenchmarkSQLFloor runs the store's Begin and Finish statements directly on
// pgx, with no gRPC: the floor a gated fresh-key call cannot go below.
func BenchmarkSQLFloor(b *testing.B) {
	benchmarkStoreFloor(b, setupWith(b, bench(stacktest.Config{})).Store)
}

// BenchmarkEmbeddedStoreFloor is the same on the embedded SQLite store.
func BenchmarkEmbeddedStoreFloor(b *testing.B) {
	store, err := sqlitestore.Open(context.Background(), b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	benchmarkStoreFloor(b, store)
}

func benchmarkStoreFloor(b *testing.B, store dedupesvc.Store) {
	fp := sha256.Sum256([]byte("charge"))
	outcome := dedupesvc.Outcome{TypeURL: "type.googleapis.com/idemgate.testing.v1.MutateResponse", Value: []byte("\n\x06charge\x10\x01")}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	ctx := context.Background()
	for _, c := range concurrencies {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			parallel(b, c, func(n int64) error {
				key := fmt.Sprintf("floor-%s-%d-%d", run, c, n)
				res, err := store.Begin(ctx, dedupesvc.BeginParams{
					Scope: "/bench.S/M", Key: key, Fingerprint: fp[:], AttemptToken: key,
					Lease: time.Minute, Retention: time.Hour,
				})
				if err != nil {
					return err
				}
				return store.Finish(ctx, dedupesvc.FinishParams{Scope: "/bench.S/M", Key: key, AttemptToken: key, Epoch: res.Epoch, Outcome: outcome})
			})
		})
	}
}

// BenchmarkPoolSize is GatedFreshKey with 64 callers and the Dedupe
// service's connection pool at each size: it chose dedupeapp's default
// -db-max-conns.
func BenchmarkPoolSize(b *testing.B) {
	req := &testingv1.MutateRequest{Payload: "charge"}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, conns := range []int32{4, 8, 16, 32} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			h := setupWith(b, bench(stacktest.Config{PoolMaxConns: conns}))
			parallel(b, 64, func(n int64) error {
				ctx := metadata.AppendToOutgoingContext(context.Background(), idemgate.KeyHeader, fmt.Sprintf("pool-%s-%d-%d", run, conns, n))
				_, err := h.client.Mutate(ctx, req)
				return err
			})
		})
	}
}

// BenchmarkGatedFreshKeyInProcess is GatedFreshKey with the gate calling
// the Dedupe service in-process (dedupesvc.NewInProcessClient).
func BenchmarkGatedFreshKeyInProcess(b *testing.B) {
	benchmarkFreshKey(b, setupWith(b, bench(stacktest.Config{InProcessDedupe: true})), "fresh-inproc")
}

// BenchmarkGatedReplayInProcess is GatedReplay through the in-process
// client.
func BenchmarkGatedReplayInProcess(b *testing.B) {
	benchmarkReplay(b, setupWith(b, bench(stacktest.Config{InProcessDedupe: true})), "replayed-inproc")
}

// BenchmarkGatedReplayCached is GatedReplay with the replay cache on: a
// duplicate is answered by the tool server alone.
func BenchmarkGatedReplayCached(b *testing.B) {
	benchmarkReplay(b, setupWith(b, bench(stacktest.Config{GateOptions: []interceptor.Option{interceptor.WithReplayCache(1024, 1<<20)}})), "replayed-cached")
}

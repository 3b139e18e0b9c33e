//go:build faults

// The real-process tests build cmd/dedupesvc (a second, non-race compile of
// every dependency) and start real processes and PostgreSQL clusters: they
// run in `make faults`, which CI runs, not in `make test`.

package main_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// tenants is a real dedupesvc on its own PostgreSQL schema with two callers,
// each authenticated by its token: an attacker and its neighbour.
type tenants struct {
	attacker, neighbour idemgatev1.DedupeServiceClient
	pool                *pgxpool.Pool
}

func startTenants(t *testing.T, flags ...string) tenants {
	t.Helper()
	dbURL := pgtest.SchemaURL(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("attacker client attacker-secret-0123456789\nneighbour client neighbour-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := stacktest.FreeAddr(t)
	args := append([]string{"-listen", addr, "-database-url", dbURL, "-token-file", tokens, "-metrics-listen="}, flags...)
	svc := proctest.Start(t, proctest.Build(t, dedupesvcPkg), args, nil)
	svc.WaitTCP(t, addr, recoverTimeout)
	client := func(token string) idemgatev1.DedupeServiceClient {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(auth.BearerToken(token, true)),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return idemgatev1.NewDedupeServiceClient(conn)
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return tenants{attacker: client("attacker-secret-0123456789"), neighbour: client("neighbour-secret-0123456789"), pool: pool}
}

// megabyte is the largest outcome the service accepts by default.
func megabyte() *anypb.Any {
	return &anypb.Any{TypeUrl: "type.googleapis.com/payments.v1.ChargeCardResponse", Value: make([]byte, 1<<20)}
}

// load is the 1-minute load average, logged beside every figure: the
// machine is shared.
func load() string {
	out, err := exec.Command("uptime").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}

// TestFinishFloodOfKeysNeverReservedIsRefusedCheaply: an attacker sends 1 MiB
// Finishes for keys it never reserved, from 32 and then 256 goroutines that
// never back off, while its neighbour reserves keys one after the other.
// The attacker's Finishes are refused for its rate (RESOURCE_EXHAUSTED with
// RetryInfo) before the store, and those let through are refused after one
// short read; the neighbour's Begins are answered. The neighbour's Begin
// latencies are logged, not asserted: the machine is shared.
func TestFinishFloodOfKeysNeverReservedIsRefusedCheaply(t *testing.T) {
	t.Parallel()
	ts := startTenants(t)
	const flood = 8 * time.Second
	for _, concurrency := range []int{0, 32, 256} {
		var (
			codesSeen    sync.Map // codes.Code -> *atomic.Int64
			rateRefusals atomic.Int64
			stop         = make(chan struct{})
			attack       sync.WaitGroup
		)
		count := func(err error) {
			c, _ := codesSeen.LoadOrStore(status.Code(err), new(atomic.Int64))
			c.(*atomic.Int64).Add(1)
			if status.Code(err) == codes.ResourceExhausted && grpcerr.Reason(err) == dedupesvc.ReasonQuotaExceeded {
				if d, ok := grpcerr.RetryDelay(err); ok && d > 0 {
					rateRefusals.Add(1)
				}
			}
		}
		outcome := megabyte()
		for g := range concurrency {
			attack.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
					_, err := ts.attacker.Finish(ctx, &idemgatev1.FinishRequest{Scope: "/payments.v1.PaymentsService/ChargeCard",
						Key: fmt.Sprintf("never-%d-%d-%d", concurrency, g, i), AttemptToken: "forged", Epoch: 1, Outcome: outcome})
					cancel()
					count(err)
				}
			})
		}
		// The neighbour: four workers, each reserving fresh keys in turn.
		var (
			mu        sync.Mutex
			latencies []time.Duration
			timeouts  atomic.Int64
			failures  []string
			neighbour sync.WaitGroup
		)
		deadline := time.Now().Add(flood)
		for w := range 4 {
			neighbour.Go(func() {
				for i := 0; time.Now().Before(deadline); i++ {
					fp := sha256.Sum256([]byte("n"))
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					start := time.Now()
					resp, err := ts.neighbour.Begin(ctx, &idemgatev1.BeginRequest{Scope: "/payments.v1.PaymentsService/ChargeCard",
						Key: fmt.Sprintf("n-%d-%d-%d", concurrency, w, i), Fingerprint: fp[:], AttemptToken: "a",
						Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)})
					took := time.Since(start)
					cancel()
					mu.Lock()
					switch {
					case status.Code(err) == codes.DeadlineExceeded:
						timeouts.Add(1)
					case err != nil || resp.GetReserved() == nil:
						failures = append(failures, fmt.Sprintf("%v %v", resp, err))
					default:
						latencies = append(latencies, took)
					}
					mu.Unlock()
				}
			})
		}
		neighbour.Wait()
		close(stop)
		attack.Wait()
		slices.Sort(latencies)
		pct := func(p float64) time.Duration {
			if len(latencies) == 0 {
				return 0
			}
			return latencies[min(len(latencies)-1, int(p*float64(len(latencies))))]
		}
		byCode := map[string]int64{}
		codesSeen.Range(func(k, v any) bool { byCode[k.(codes.Code).String()] = v.(*atomic.Int64).Load(); return true })
		t.Logf("%d attackers: neighbour Begins answered %d, p50 %s, p99 %s, max %s, timed out (2s) %d; attacker Finishes %v; load: %s",
			concurrency, len(latencies), pct(0.5), pct(0.99), pct(1), timeouts.Load(), byCode, load())
		if len(failures) > 0 {
			t.Errorf("%d attackers: the neighbour's Begins failed: %v", concurrency, failures[:min(len(failures), 5)])
		}
		if concurrency > 0 && rateRefusals.Load() == 0 {
			t.Errorf("%d attackers sending 1 MiB Finishes for %s: none was refused for its rate (RESOURCE_EXHAUSTED %s with RetryInfo); by code %v",
				concurrency, flood, dedupesvc.ReasonQuotaExceeded, byCode)
		}
	}
}

// TestReservedKeysFinishedLargeStayNearTheBytesQuota: an attacker reserves
// five times its bytes quota's worth of keys while it stores nothing (every
// Begin is under the quota), then finishes each with 1 MiB, 32 at a time,
// retrying a Finish refused for its rate as an interceptor does. Outcomes
// past the quota are replaced by the ResultTooLarge marker: every key
// replays its outcome or the marker (nothing lost, nothing runs again), and
// the bytes stored are logged against the quota (the overshoot bound is the
// caller's outcome rate times the usage compaction interval, plus its
// burst: reasoned, not asserted, since it depends on when compactions run).
func TestReservedKeysFinishedLargeStayNearTheBytesQuota(t *testing.T) {
	t.Parallel()
	const quota = 64 << 20
	ts := startTenants(t, "-caller-max-bytes", fmt.Sprint(quota))
	const keys = 5 * quota >> 20
	fp := sha256.Sum256([]byte("a"))
	epochs := make([]int64, keys)
	for i := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		resp, err := ts.attacker.Begin(ctx, &idemgatev1.BeginRequest{Scope: "/s.S/M", Key: fmt.Sprint("k", i), Fingerprint: fp[:], AttemptToken: "a",
			Lease: durationpb.New(time.Hour), Retention: durationpb.New(time.Hour)})
		cancel()
		if err != nil || resp.GetReserved() == nil {
			t.Fatalf("Begin %d = %v, %v; want reserved (nothing is stored yet)", i, resp, err)
		}
		epochs[i] = resp.GetReserved().GetEpoch()
	}
	start := time.Now()
	var (
		next       atomic.Int64
		rateWaits  atomic.Int64
		finishers  sync.WaitGroup
		errMu      sync.Mutex
		finishErrs []string
	)
	outcome := megabyte()
	for range 32 {
		finishers.Go(func() {
			for i := int(next.Add(1) - 1); i < keys; i = int(next.Add(1) - 1) {
				for {
					ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
					_, err := ts.attacker.Finish(ctx, &idemgatev1.FinishRequest{Scope: "/s.S/M", Key: fmt.Sprint("k", i), AttemptToken: "a", Epoch: epochs[i], Outcome: outcome})
					cancel()
					if d, ok := grpcerr.RetryDelay(err); ok && status.Code(err) == codes.ResourceExhausted {
						rateWaits.Add(1)
						time.Sleep(d)
						continue
					}
					if err != nil {
						errMu.Lock()
						finishErrs = append(finishErrs, err.Error())
						errMu.Unlock()
					}
					break
				}
			}
		})
	}
	finishers.Wait()
	took := time.Since(start)
	if len(finishErrs) > 0 {
		t.Fatalf("%d Finishes failed, e.g. %s", len(finishErrs), finishErrs[0])
	}
	var stored, markers int64
	if err := ts.pool.QueryRow(context.Background(), `SELECT coalesce(sum(octet_length(outcome_value)), 0)::bigint,
		count(*) FILTER (WHERE outcome_type_url = 'type.googleapis.com/idemgate.v1.ResultTooLarge')
		FROM idemgate_records WHERE namespace = 'attacker'`).Scan(&stored, &markers); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d keys finished with 1 MiB in %s (%d rate refusals retried): %d bytes stored against a quota of %d (%.2fx), %d markers; load: %s",
		keys, took.Round(time.Millisecond), rateWaits.Load(), stored, quota, float64(stored)/quota, markers, load())
	if markers == 0 {
		t.Errorf("all %d outcomes of 1 MiB were stored against a quota of %d MiB: %d bytes", keys, quota>>20, stored)
	}
	// Every key replays its outcome or the marker. The flood left the
	// caller's outcome byte bucket short, which refuses its Begins for a
	// moment: a duplicate waits as the RetryInfo says, as a gate's caller.
	for i := range keys {
		var (
			resp *idemgatev1.BeginResponse
			err  error
		)
		for deadline := time.Now().Add(time.Minute); ; {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			resp, err = ts.attacker.Begin(ctx, &idemgatev1.BeginRequest{Scope: "/s.S/M", Key: fmt.Sprint("k", i), Fingerprint: fp[:], AttemptToken: "dup",
				Lease: durationpb.New(time.Hour), Retention: durationpb.New(time.Hour)})
			cancel()
			d, ok := grpcerr.RetryDelay(err)
			if status.Code(err) != codes.ResourceExhausted || !ok || time.Now().After(deadline) {
				break
			}
			time.Sleep(d)
		}
		if err != nil || resp.GetCompleted() == nil {
			t.Fatalf("duplicate of k%d = %v, %v; want its outcome or the marker replayed", i, resp, err)
		}
		if u := resp.GetCompleted().GetOutcome().GetTypeUrl(); u != outcome.GetTypeUrl() && u != "type.googleapis.com/idemgate.v1.ResultTooLarge" {
			t.Fatalf("duplicate of k%d replays %s", i, u)
		}
	}
}

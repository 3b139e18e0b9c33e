package dedupesvc_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/testlog"
)

func TestCallerRateLimitsOneCallerOnly(t *testing.T) {
	t.Parallel()
	store := &fakeStore{begin: dedupesvc.BeginResult{State: dedupesvc.BeginReserved, Epoch: 1}}
	metrics := dedupesvc.NewMetrics()
	srv := dedupesvc.NewServer(store, dedupesvc.WithCallerRate(0.001, 2), dedupesvc.WithMetrics(metrics))
	greedy := dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: "greedy"})
	for i := range 2 {
		if _, err := srv.Begin(greedy, validBegin()); err != nil {
			t.Fatalf("Begin %d within the burst: %v", i, err)
		}
	}
	calls := store.calls
	_, err := srv.Begin(greedy, validBegin())
	if status.Code(err) != codes.ResourceExhausted || grpcerr.Reason(err) != dedupesvc.ReasonQuotaExceeded {
		t.Fatalf("Begin past the rate = %v; want RESOURCE_EXHAUSTED %s", err, dedupesvc.ReasonQuotaExceeded)
	}
	if d, ok := grpcerr.RetryDelay(err); !ok || d <= 0 {
		t.Fatalf("Begin past the rate has RetryInfo %v, %v; want a delay", d, ok)
	}
	if info := errorInfo(t, err); info.GetMetadata()["quota"] != dedupesvc.QuotaRate || info.GetMetadata()["limit"] == "" {
		t.Fatalf("ErrorInfo metadata %v; want quota rate and its limit", info.GetMetadata())
	}
	if store.calls != calls {
		t.Fatal("a Begin refused for its rate reached the store")
	}
	neighbour := dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: "neighbour"})
	if _, err := srv.Begin(neighbour, validBegin()); err != nil {
		t.Fatalf("another caller's Begin: %v", err)
	}
	if got := testutil.ToFloat64(metrics.QuotaCounter(dedupesvc.QuotaRate)); got != 1 {
		t.Fatalf("idemgate_dedupe_quota_exceeded_total{quota=rate} = %v, want 1", got)
	}
}

func TestRetentionOverTheCapIsRefusedNamingIt(t *testing.T) {
	t.Parallel()
	store := &fakeStore{begin: dedupesvc.BeginResult{State: dedupesvc.BeginReserved, Epoch: 1}}
	metrics := dedupesvc.NewMetrics()
	srv := dedupesvc.NewServer(store, dedupesvc.WithMaxRetention(48*time.Hour), dedupesvc.WithMetrics(metrics))
	req := validBegin()
	req.Retention = durationpb.New(365 * 24 * time.Hour)
	_, err := srv.Begin(context.Background(), req)
	if status.Code(err) != codes.InvalidArgument || grpcerr.Reason(err) != dedupesvc.ReasonInvalidRequest {
		t.Fatalf("Begin over the retention cap = %v; want INVALID_ARGUMENT", err)
	}
	info := errorInfo(t, err)
	if info.GetMetadata()["field"] != "retention" || info.GetMetadata()["max_retention"] != "48h0m0s" || !strings.Contains(status.Convert(err).Message(), "48h0m0s") {
		t.Fatalf("refusal %v, metadata %v; want it to name the cap", err, info.GetMetadata())
	}
	if store.calls != 0 {
		t.Fatal("a refused Begin reached the store")
	}
	req.Retention = durationpb.New(48 * time.Hour)
	if _, err := srv.Begin(context.Background(), req); err != nil {
		t.Fatalf("Begin at the cap: %v", err)
	}
	if got := testutil.ToFloat64(metrics.QuotaCounter(dedupesvc.QuotaRetention)); got != 1 {
		t.Fatalf("idemgate_dedupe_quota_exceeded_total{quota=retention} = %v, want 1", got)
	}
}

func errorInfo(t *testing.T, err error) *errdetails.ErrorInfo {
	t.Helper()
	var infos []*errdetails.ErrorInfo
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			infos = append(infos, info)
		}
	}
	if len(infos) != 1 {
		t.Fatalf("%v has %d ErrorInfo, want 1", err, len(infos))
	}
	return infos[0]
}

// flakyCompactor fails while failing is set, and counts its calls.
type flakyCompactor struct {
	calls   atomic.Int64
	failing atomic.Bool
}

func (f *flakyCompactor) CompactUsage(context.Context) (int64, error) {
	f.calls.Add(1)
	if f.failing.Load() {
		return 0, errors.New("store down")
	}
	return 1, nil
}

func TestRunUsageCompactionLogsAFailureOnceAndTheRecovery(t *testing.T) {
	t.Parallel()
	var logs testlog.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	f := &flakyCompactor{}
	f.failing.Store(true)
	c, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { dedupesvc.RunUsageCompaction(c, f, 10*time.Millisecond, logger); close(done) }()
	waitCalls := func(n int64) {
		deadline := time.Now().Add(time.Minute)
		for f.calls.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d compactions in a minute, want %d", f.calls.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitCalls(5)
	f.failing.Store(false)
	waitCalls(f.calls.Load() + 3)
	cancel()
	<-done
	out := logs.String()
	if n := strings.Count(out, "compacting quota usage failed"); n != 1 {
		t.Errorf("the failure was logged %d times over a run of failures, want once:\n%s", n, out)
	}
	if n := strings.Count(out, "compacting quota usage works again"); n != 1 {
		t.Errorf("the recovery was logged %d times, want once:\n%s", n, out)
	}
}

// TestDefaultRateLetsABusyToolServerThrough: with the default limit, one
// caller sending more Begins at once than the store takes in a second (the
// embedded store's ~9,000 a second at 64 callers, BENCHMARKS.md) is not
// refused. The old default (500/s, burst 1,000) refused it after 1,000.
func TestDefaultRateLetsABusyToolServerThrough(t *testing.T) {
	t.Parallel()
	store := &fakeStore{begin: dedupesvc.BeginResult{State: dedupesvc.BeginReserved, Epoch: 1}}
	srv := dedupesvc.NewServer(store)
	busy := dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: "busy"})
	for i := range 9000 {
		if _, err := srv.Begin(busy, validBegin()); err != nil {
			t.Fatalf("Begin %d of one busy caller with the default rate: %v", i, err)
		}
	}
}

// checkingStore is a fakeStore that is a FinishChecker: CheckFinish answers
// err, and counts.
type checkingStore struct {
	fakeStore
	checks   int
	checkErr error
}

func (s *checkingStore) CheckFinish(context.Context, dedupesvc.FinishParams) (bool, error) {
	s.checks++
	return false, s.checkErr
}

func validFinish(n int) *idemgatev1.FinishRequest {
	return &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: "order-1", AttemptToken: "attempt-1", Epoch: 1,
		Outcome: &anypb.Any{TypeUrl: "type.googleapis.com/test.A", Value: make([]byte, n)}}
}

// TestFinishIsRateLimitedBeforeTheStore: Finishes count against their
// caller's rate, and their outcome bytes against its byte rate; past either
// a Finish is refused RESOURCE_EXHAUSTED (quota rate) with RetryInfo before
// it reaches the store, and another caller is not affected.
func TestFinishIsRateLimitedBeforeTheStore(t *testing.T) {
	t.Parallel()
	greedy := dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: "greedy"})
	neighbour := dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: "neighbour"})
	wantRate := func(t *testing.T, what string, err error) {
		t.Helper()
		if status.Code(err) != codes.ResourceExhausted || grpcerr.Reason(err) != dedupesvc.ReasonQuotaExceeded {
			t.Fatalf("%s = %v; want RESOURCE_EXHAUSTED %s", what, err, dedupesvc.ReasonQuotaExceeded)
		}
		if d, ok := grpcerr.RetryDelay(err); !ok || d <= 0 {
			t.Fatalf("%s has RetryInfo %v, %v; want a delay", what, d, ok)
		}
		if info := errorInfo(t, err); info.GetMetadata()["quota"] != dedupesvc.QuotaRate || info.GetMetadata()["limit"] == "" {
			t.Fatalf("%s: ErrorInfo metadata %v; want quota rate and its limit", what, info.GetMetadata())
		}
	}

	t.Run("by count", func(t *testing.T) {
		t.Parallel()
		store := &fakeStore{}
		srv := dedupesvc.NewServer(store, dedupesvc.WithCallerRate(0.001, 2))
		for i := range 2 {
			if _, err := srv.Finish(greedy, validFinish(10)); err != nil {
				t.Fatalf("Finish %d within the burst: %v", i, err)
			}
		}
		calls := store.calls
		_, err := srv.Finish(greedy, validFinish(10))
		wantRate(t, "a Finish past the rate", err)
		if store.calls != calls {
			t.Fatal("a Finish refused for its rate reached the store")
		}
		if _, err := srv.Finish(neighbour, validFinish(10)); err != nil {
			t.Fatalf("another caller's Finish: %v", err)
		}
	})

	t.Run("as it arrives, while the byte bucket holds less than the largest outcome", func(t *testing.T) {
		t.Parallel()
		srv := dedupesvc.NewServer(&fakeStore{}, dedupesvc.WithCallerOutcomeRate(1, 1), dedupesvc.WithMaxOutcomeBytes(1000))
		if err := srv.AdmitFinish("greedy"); err != nil {
			t.Fatalf("a caller not seen yet: %v", err)
		}
		if _, err := srv.Finish(greedy, validFinish(1000)); err != nil {
			t.Fatal(err)
		}
		wantRate(t, "AdmitFinish with less than an outcome left", srv.AdmitFinish("greedy"))
		if err := srv.AdmitFinish("neighbour"); err != nil {
			t.Fatalf("another caller: %v", err)
		}
	})

	// A Begin reserves work whose outcome must be stored: while the caller's
	// Finishes would be refused for their bytes, its Begins are refused as
	// well, so no handler runs whose outcome cannot be stored within the
	// interceptor's finish budget.
	t.Run("Begins too, while Finishes could not store", func(t *testing.T) {
		t.Parallel()
		store := &fakeStore{begin: dedupesvc.BeginResult{State: dedupesvc.BeginReserved, Epoch: 1}}
		srv := dedupesvc.NewServer(store, dedupesvc.WithCallerOutcomeRate(1, 1), dedupesvc.WithMaxOutcomeBytes(1000))
		if _, err := srv.Begin(greedy, validBegin()); err != nil {
			t.Fatalf("a Begin with the byte bucket full: %v", err)
		}
		if _, err := srv.Finish(greedy, validFinish(1000)); err != nil {
			t.Fatal(err)
		}
		calls := store.calls
		_, err := srv.Begin(greedy, validBegin())
		wantRate(t, "a Begin while the caller's Finishes would be refused for their bytes", err)
		if store.calls != calls {
			t.Fatal("a Begin refused for the byte rate reached the store")
		}
		if _, err := srv.Begin(neighbour, validBegin()); err != nil {
			t.Fatalf("another caller's Begin: %v", err)
		}
	})

	t.Run("by outcome bytes", func(t *testing.T) {
		t.Parallel()
		store := &fakeStore{}
		// The burst is raised to the largest outcome, so one always passes.
		srv := dedupesvc.NewServer(store, dedupesvc.WithCallerOutcomeRate(1, 1), dedupesvc.WithMaxOutcomeBytes(1000))
		if _, err := srv.Finish(greedy, validFinish(1000)); err != nil {
			t.Fatalf("the largest outcome within the burst: %v", err)
		}
		calls := store.calls
		_, err := srv.Finish(greedy, validFinish(1000))
		wantRate(t, "a Finish past the byte rate", err)
		if store.calls != calls {
			t.Fatal("a Finish refused for its byte rate reached the store")
		}
		if _, err := srv.Finish(neighbour, validFinish(1000)); err != nil {
			t.Fatalf("another caller's Finish: %v", err)
		}
	})
}

// TestLargeFinishOfAKeyNotHeldIsRefusedByACheck: a Finish with a large
// outcome first asks a FinishChecker store whether the attempt holds the
// key; one that does not is refused without the outcome being sent, a
// small one is sent at once.
func TestLargeFinishOfAKeyNotHeldIsRefusedByACheck(t *testing.T) {
	t.Parallel()
	store := &checkingStore{checkErr: dedupesvc.ErrNotHeld}
	srv := dedupesvc.NewServer(store)
	_, err := srv.Finish(context.Background(), validFinish(dedupesvc.FinishCheckBytes))
	if status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != dedupesvc.ReasonReservationNotHeld {
		t.Fatalf("a large Finish of a key not held = %v; want FAILED_PRECONDITION %s", err, dedupesvc.ReasonReservationNotHeld)
	}
	if store.checks != 1 || store.calls != 0 {
		t.Fatalf("%d checks and %d Finishes reached the store; want one check and no Finish", store.checks, store.calls)
	}
	if _, err := srv.Finish(context.Background(), validFinish(100)); err != nil || store.checks != 1 {
		t.Fatalf("a small Finish = %v after %d checks; want it sent without a check", err, store.checks)
	}
}

// TestFinishRefusedForItsBytesSpendsNoFinish: a Finish refused for its
// caller's outcome-byte rate takes nothing from the caller's Finish-count
// bucket, so the caller keeps every Finish it had before the refusals.
func TestFinishRefusedForItsBytesSpendsNoFinish(t *testing.T) {
	t.Parallel()
	// Three Finishes a burst, next to none a second; the byte bucket holds
	// one largest outcome plus MaxTypeURLBytes, refilling a byte a second.
	srv := dedupesvc.NewServer(&fakeStore{}, dedupesvc.WithCallerRate(0.001, 3),
		dedupesvc.WithCallerOutcomeRate(1, 1), dedupesvc.WithMaxOutcomeBytes(1000))
	caller := dedupesvc.ContextWithCaller(context.Background(), dedupesvc.Caller{Name: "caller"})
	if _, err := srv.Finish(caller, validFinish(1000)); err != nil {
		t.Fatalf("the first Finish: %v", err)
	}
	// Two Finishes are left. Each of these is refused for its bytes.
	for i := range 5 {
		_, err := srv.Finish(caller, validFinish(1000))
		if status.Code(err) != codes.ResourceExhausted || !strings.HasSuffix(errorInfo(t, err).GetMetadata()["limit"], " bytes") {
			t.Fatalf("large Finish %d past the byte rate = %v; want it refused for its outcome bytes", i, err)
		}
	}
	// Small outcomes fit in what the byte bucket has left.
	for i := range 2 {
		if _, err := srv.Finish(caller, validFinish(0)); err != nil {
			t.Fatalf("small Finish %d of the two the caller had left before the byte refusals: %v", i, err)
		}
	}
	_, err := srv.Finish(caller, validFinish(0))
	if status.Code(err) != codes.ResourceExhausted || errorInfo(t, err).GetMetadata()["limit"] != "0.001/s" {
		t.Fatalf("a Finish past the count burst = %v; want it refused for the Finish rate", err)
	}
}

// lagCompactor reports lag after every round; it fails while failing is set,
// reporting lag 0 (the store unreachable before it measured anything).
type lagCompactor struct {
	calls   atomic.Int64
	failing atomic.Bool
	lag     atomic.Int64 // time.Duration
}

func (l *lagCompactor) CompactUsage(ctx context.Context) (int64, error) {
	n, _, err := l.CompactUsageLag(ctx)
	return n, err
}

func (l *lagCompactor) CompactUsageLag(context.Context) (int64, time.Duration, error) {
	defer l.calls.Add(1)
	if l.failing.Load() {
		return 0, 0, errors.New("store down")
	}
	return 1, time.Duration(l.lag.Load()), nil
}

// RunUsageCompactionWith sets idemgate_usage_compaction_lag_seconds to what
// each round measured, and leaves it as it was over a round that measured
// nothing.
func TestRunUsageCompactionWithSetsTheLag(t *testing.T) {
	t.Parallel()
	m := dedupesvc.NewMetrics()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	l := &lagCompactor{}
	l.lag.Store(int64(42 * time.Second))
	c, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		dedupesvc.RunUsageCompactionWith(c, l, dedupesvc.UsageCompactionConfig{Interval: 10 * time.Millisecond, Metrics: m})
		close(done)
	}()
	defer func() { cancel(); <-done }()
	waitCalls := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for l.calls.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d compactions in a minute, want %d", l.calls.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	lag := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "idemgate_usage_compaction_lag_seconds" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("idemgate_usage_compaction_lag_seconds is not registered")
		return 0
	}
	waitCalls(2)
	if got := lag(); got != 42 {
		t.Fatalf("lag %v after rounds measuring 42s, want 42", got)
	}
	l.failing.Store(true)
	waitCalls(l.calls.Load() + 2)
	if got := lag(); got != 42 {
		t.Fatalf("lag %v after rounds that reached no store, want the last measured 42", got)
	}
	l.failing.Store(false)
	l.lag.Store(0)
	// Three: the first may have begun before the change, and a round's
	// gauge is set after its call is counted.
	waitCalls(l.calls.Load() + 3)
	if got := lag(); got != 0 {
		t.Fatalf("lag %v after rounds with nothing waiting, want 0", got)
	}
}

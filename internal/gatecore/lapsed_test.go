package gatecore_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// cutOffDedupe reserves, then renews no lease (heartbeats UNAVAILABLE
// unless renew) and fails the first Finish UNAVAILABLE, as a holder cut off
// from the service sees it; later Finishes answer later.
type cutOffDedupe struct {
	idemgatev1.DedupeServiceClient
	renew bool
	// later answers every Finish after the first.
	later    error
	finishes atomic.Int64
}

func (d *cutOffDedupe) Begin(context.Context, *idemgatev1.BeginRequest, ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_Reserved_{Reserved: &idemgatev1.BeginResponse_Reserved{Epoch: 1}}}, nil
}

func (d *cutOffDedupe) Heartbeat(context.Context, *idemgatev1.HeartbeatRequest, ...grpc.CallOption) (*idemgatev1.HeartbeatResponse, error) {
	if d.renew {
		return &idemgatev1.HeartbeatResponse{}, nil
	}
	return nil, status.Error(codes.Unavailable, "cut off")
}

func (d *cutOffDedupe) Finish(context.Context, *idemgatev1.FinishRequest, ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	if d.finishes.Add(1) == 1 {
		return nil, status.Error(codes.Unavailable, "cut off")
	}
	if d.later != nil {
		return nil, d.later
	}
	return &idemgatev1.FinishResponse{}, nil
}

// An attempt whose lease ran out with no renewal the service confirmed,
// and whose first Finish failed, must not hand its caller its own answer
// before the store has taken it: another attempt may have taken the key
// over and stored another outcome (the conformance suite's FencedHolder
// case saw exactly that). It retries the Finish before answering: stored,
// the caller gets its answer (a store outage longer than the lease costs
// the holder nothing); refused, or still unanswered after a lease, the
// caller gets the fenced answer and its retry gets whatever is stored.
// With a lease still confirmed the failed Finish is retried before the
// answer too (TestAConfirmedLeaseIsAnsweredOnlyOnceStored).
func TestAnUnconfirmedLapsedLeaseIsAnsweredOnlyOnceStored(t *testing.T) {
	outcome, err := anypb.New(wrapperspb.String("charged"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		renew bool
		later error
		lease time.Duration
		// wait, past a lapsing lease: waiting longer on a starved machine
		// only makes the lapse surer.
		wait       time.Duration
		wantFenced bool
		// wantStoredFirst: the retried Finish landed before the answer.
		wantStoredFirst bool
	}{
		{"lapsed, then stored", false, nil, time.Second, 1500 * time.Millisecond, false, true},
		{"lapsed, then refused", false, status.Error(codes.FailedPrecondition, "taken over"), time.Second, 1500 * time.Millisecond, true, true},
		{"lapsed, never answered", false, status.Error(codes.Unavailable, "cut off"), time.Second, 1500 * time.Millisecond, true, true},
		// Rejected for good (a rotated credential, say): nothing stored, so
		// another attempt's outcome may be what the key keeps.
		{"lapsed, then rejected", false, status.Error(codes.PermissionDenied, "token rotated"), time.Second, 1500 * time.Millisecond, true, true},
		// A long lease, finished at once: it cannot have lapsed.
		{"confirmed", true, nil, time.Minute, 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &cutOffDedupe{renew: tc.renew, later: tc.later}
			e := gatecore.New(d, gatecore.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), FinishBudget: 3 * time.Second})
			c := gatecore.NewCall("tool", "scope", "key-1", []byte("fp"),
				gatecore.Policy{Lease: tc.lease, MaxWait: time.Second, ExecutionTimeout: time.Hour}, time.Hour)
			begun, err := e.Begin(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			a := e.Start(context.Background(), c, begun)
			time.Sleep(tc.wait)
			if fenced := a.Finish(outcome, false); fenced != tc.wantFenced {
				t.Errorf("Finish reported fenced = %v, want %v", fenced, tc.wantFenced)
			}
			if n := d.finishes.Load(); tc.wantStoredFirst && n < 2 {
				t.Errorf("Finishes before the answer = %d, want the failed one retried before answering", n)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := e.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if n := d.finishes.Load(); n < 2 {
				t.Errorf("Finishes = %d, want the failed one retried", n)
			}
		})
	}
}

// partitioned is a holder cut off from the service (no renewal, no Finish
// gets through) until takeoverAt, when another attempt has taken the key
// over: from then on its Finish is refused as fenced.
type partitioned struct {
	idemgatev1.DedupeServiceClient
	takeoverAt time.Time
	refused    atomic.Int64
}

func (d *partitioned) Begin(context.Context, *idemgatev1.BeginRequest, ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_Reserved_{Reserved: &idemgatev1.BeginResponse_Reserved{Epoch: 1}}}, nil
}

func (d *partitioned) Heartbeat(context.Context, *idemgatev1.HeartbeatRequest, ...grpc.CallOption) (*idemgatev1.HeartbeatResponse, error) {
	return nil, status.Error(codes.Unavailable, "cut off")
}

func (d *partitioned) Finish(context.Context, *idemgatev1.FinishRequest, ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	if time.Now().Before(d.takeoverAt) {
		return nil, status.Error(codes.Unavailable, "cut off")
	}
	d.refused.Add(1)
	return nil, status.Error(codes.FailedPrecondition, "taken over")
}

// FINISH_POLICY_AFTER_REPLY answers before the outcome is stored only while
// the lease is confirmed: a holder whose lease lapsed unconfirmed stores
// first, so a caller answered with its own response never finds another
// attempt's outcome stored under the key.
func TestAfterReplyWithALapsedLeaseStoresBeforeAnswering(t *testing.T) {
	outcome, err := anypb.New(wrapperspb.String("charged"))
	if err != nil {
		t.Fatal(err)
	}
	const lease = time.Second
	d := &partitioned{}
	e := gatecore.New(d, gatecore.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), FinishBudget: 5 * time.Second})
	c := gatecore.NewCall("tool", "scope", "key-1", []byte("fp"),
		gatecore.Policy{Lease: lease, MaxWait: time.Second, ExecutionTimeout: time.Hour, FinishAfterReply: true}, time.Hour)
	begun, err := e.Begin(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	d.takeoverAt = time.Now().Add(lease + 200*time.Millisecond)
	a := e.Start(context.Background(), c, begun)
	// Past the takeover: waiting longer on a starved machine changes nothing.
	time.Sleep(lease + 500*time.Millisecond)
	fenced := a.Finish(outcome, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !fenced {
		t.Errorf("answered with its own response, its Finish refused as fenced %d times: duplicates get another attempt's outcome", d.refused.Load())
	}
}

// flakyFinish reserves and renews every lease; its Finishes fail
// UNAVAILABLE until storeAfterRenewals renewals have been confirmed (never
// when negative), as a holder whose first Finish is lost while its lease is
// still confirmed sees it.
type flakyFinish struct {
	idemgatev1.DedupeServiceClient
	storeAfterRenewals, renewals, finishes atomic.Int64
	stored                                 atomic.Bool
	// rejected, when set, answers every Finish: refused for good.
	rejected error
}

func (d *flakyFinish) Begin(context.Context, *idemgatev1.BeginRequest, ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_Reserved_{Reserved: &idemgatev1.BeginResponse_Reserved{Epoch: 1}}}, nil
}

func (d *flakyFinish) Heartbeat(context.Context, *idemgatev1.HeartbeatRequest, ...grpc.CallOption) (*idemgatev1.HeartbeatResponse, error) {
	d.renewals.Add(1)
	return &idemgatev1.HeartbeatResponse{}, nil
}

func (d *flakyFinish) Finish(context.Context, *idemgatev1.FinishRequest, ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	d.finishes.Add(1)
	if d.rejected != nil {
		return nil, d.rejected
	}
	if n := d.storeAfterRenewals.Load(); n < 0 || d.renewals.Load() < n {
		return nil, status.Error(codes.Unavailable, "lost")
	}
	d.stored.Store(true)
	return &idemgatev1.FinishResponse{}, nil
}

// A holder whose lease is still confirmed when its first Finish fails must
// not answer its caller with an outcome the store has not taken (issue 31):
// cut off afterwards past its lease, another attempt may take the key over
// (REEXECUTE) and the caller's answer would name an execution the key never
// replays. It retries before answering, renewing its lease all along: once
// stored the caller gets its response; still not stored after the bound (a
// lease, within the finish retry budget and the caller's own deadline) the
// caller gets the retryable fenced answer (IDEMPOTENCY_IN_FLIGHT), and the
// retries go on in the background.
func TestAConfirmedLeaseIsAnsweredOnlyOnceStored(t *testing.T) {
	outcome, err := anypb.New(wrapperspb.String("charged"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		// storeAfterRenewals: the Finish is stored only once this many
		// renewals were confirmed, so storing it before the answer takes
		// renewals while the caller waits; negative, never.
		storeAfterRenewals int64
		lease              time.Duration
		// callerGone: the caller's context has ended by the Finish.
		callerGone bool
		wantFenced bool
		// rejected: every Finish is refused for good (a rotated
		// credential): nothing is stored, so the caller is not answered
		// with it either.
		rejected error
	}{
		{"stored on a retry while renewing", 1, 10 * time.Second, false, false, nil},
		{"never stored within a lease", -1, 2 * time.Second, false, true, nil},
		{"the caller gave up", 1 << 62, time.Minute, true, true, nil},
		{"rejected for good", 0, time.Minute, false, true, status.Error(codes.PermissionDenied, "token rotated")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &flakyFinish{rejected: tc.rejected}
			d.storeAfterRenewals.Store(tc.storeAfterRenewals)
			e := gatecore.New(d, gatecore.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), FinishBudget: time.Minute})
			c := gatecore.NewCall("tool", "scope", "key-1", []byte("fp"),
				gatecore.Policy{Lease: tc.lease, MaxWait: time.Second, ExecutionTimeout: time.Hour}, time.Hour)
			begun, err := e.Begin(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancelCaller := context.WithCancel(context.Background())
			defer cancelCaller()
			a := e.Start(ctx, c, begun)
			if tc.callerGone {
				cancelCaller()
			}
			fenced := a.Finish(outcome, false)
			if fenced != tc.wantFenced {
				t.Errorf("Finish reported fenced = %v, want %v (Finishes %d, renewals %d)", fenced, tc.wantFenced, d.finishes.Load(), d.renewals.Load())
			}
			if !fenced && !d.stored.Load() {
				t.Errorf("the caller got its own answer with its outcome not stored (Finishes %d)", d.finishes.Load())
			}
			if tc.storeAfterRenewals < 0 && d.finishes.Load() < 2 {
				t.Errorf("Finishes before the answer = %d, want the failed one retried before answering", d.finishes.Load())
			}
			if tc.callerGone {
				d.storeAfterRenewals.Store(0) // the store is back: the background retry lands
			}
			closeCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if tc.storeAfterRenewals < 0 {
				cancel() // never stored: stop the background retries
			}
			_ = e.Close(closeCtx)
			if tc.callerGone && !d.stored.Load() {
				t.Errorf("the caller gave up and the outcome was never stored (Finishes %d)", d.finishes.Load())
			}
		})
	}
}

// slowBegin answers Begin Reserved only after took (a slow store, or a
// long wait, as the gate sees it), and Heartbeat with renewal.
type slowBegin struct {
	idemgatev1.DedupeServiceClient
	took    time.Duration
	renewal error
}

func (d *slowBegin) Begin(context.Context, *idemgatev1.BeginRequest, ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	time.Sleep(d.took)
	return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_Reserved_{Reserved: &idemgatev1.BeginResponse_Reserved{Epoch: 1}}}, nil
}

func (d *slowBegin) Heartbeat(context.Context, *idemgatev1.HeartbeatRequest, ...grpc.CallOption) (*idemgatev1.HeartbeatResponse, error) {
	return &idemgatev1.HeartbeatResponse{}, d.renewal
}

func (d *slowBegin) Finish(context.Context, *idemgatev1.FinishRequest, ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	return &idemgatev1.FinishResponse{}, nil
}

func (d *slowBegin) Release(context.Context, *idemgatev1.ReleaseRequest, ...grpc.CallOption) (*idemgatev1.ReleaseResponse, error) {
	return &idemgatev1.ReleaseResponse{}, nil
}

// A Begin answered a whole lease after it was sent may have reserved the
// key early and lost it since (issue 31: the Begin's deadline, the Dedupe
// timeout plus max_wait, may outlast the lease): the handler runs only
// once a renewal confirms the reservation; refused, the caller gets the
// fenced answer and nothing runs.
func TestABeginAnsweredAfterItsLeaseRunsOnlyOnceConfirmed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		renewal  error
		wantRuns int64
	}{
		{"taken over meanwhile", status.Error(codes.FailedPrecondition, "taken over"), 0},
		{"still held", nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const lease = time.Second
			d := &slowBegin{took: lease + 300*time.Millisecond, renewal: tc.renewal}
			e := gatecore.New(d, gatecore.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			defer func() { _ = e.Close(context.Background()) }()
			tr := &stringTransport{ran: func(context.Context) gatecore.Ran {
				return gatecore.Ran{Verdict: gatecore.VerdictOutcome, Answer: "charged", Outcome: outcomeOf(t, "charged")}
			}}
			c := gatecore.NewCall("tool", "scope", "key-1", []byte("fp"),
				gatecore.Policy{Lease: lease, MaxWait: 10 * time.Second, ExecutionTimeout: time.Minute}, time.Hour)
			_, _, err := e.Gate(context.Background(), c, tr, time.Now())
			if got := tr.runs.Load(); got != tc.wantRuns {
				t.Fatalf("the handler ran %d times, want %d (answer %v)", got, tc.wantRuns, err)
			}
			if tc.wantRuns == 0 && grpcerr.Reason(err) != idemgate.ReasonInFlight {
				t.Errorf("answered %v, want IDEMPOTENCY_IN_FLIGHT", err)
			}
			if tc.wantRuns == 1 && err != nil {
				t.Errorf("answered %v, want the handler's answer", err)
			}
		})
	}
}

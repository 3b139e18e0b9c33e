package dedupesvc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/testlog"
)

// fakeStore records calls and answers what the test sets.
type fakeStore struct {
	calls int
	begin dedupesvc.BeginResult
	err   error
}

func (f *fakeStore) Begin(context.Context, dedupesvc.BeginParams) (dedupesvc.BeginResult, error) {
	f.calls++
	return f.begin, f.err
}
func (f *fakeStore) Finish(context.Context, dedupesvc.FinishParams) error   { f.calls++; return f.err }
func (f *fakeStore) Release(context.Context, dedupesvc.ReleaseParams) error { f.calls++; return f.err }
func (f *fakeStore) Heartbeat(context.Context, dedupesvc.HeartbeatParams) (time.Time, error) {
	f.calls++
	return time.Time{}, f.err
}
func (f *fakeStore) Resolve(context.Context, dedupesvc.ResolveParams) error { f.calls++; return f.err }
func (f *fakeStore) ReleaseLost(context.Context, dedupesvc.ReleaseLostParams) (int, error) {
	f.calls++
	return 0, f.err
}
func (f *fakeStore) DeleteExpired(context.Context, int) (int, []dedupesvc.RecordID, error) {
	f.calls++
	return 0, nil, f.err
}

func validBegin() *idemgatev1.BeginRequest {
	return &idemgatev1.BeginRequest{
		Scope:        "/pkg.S/M",
		Key:          "order-1",
		Fingerprint:  make([]byte, 32),
		AttemptToken: "attempt-1",
		Lease:        durationpb.New(10 * time.Second),
		Retention:    durationpb.New(time.Hour),
	}
}

func TestBeginValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*idemgatev1.BeginRequest)
		field  string
	}{
		{"no scope", func(r *idemgatev1.BeginRequest) { r.Scope = "" }, "scope"},
		{"scope too long", func(r *idemgatev1.BeginRequest) { r.Scope = strings.Repeat("s", 1025) }, "scope"},
		{"no key", func(r *idemgatev1.BeginRequest) { r.Key = "" }, "key"},
		{"key too long", func(r *idemgatev1.BeginRequest) { r.Key = strings.Repeat("k", 256) }, "key"},
		{"key not printable", func(r *idemgatev1.BeginRequest) { r.Key = "a\nb" }, "key"},
		{"short fingerprint", func(r *idemgatev1.BeginRequest) { r.Fingerprint = []byte{1} }, "fingerprint"},
		{"no token", func(r *idemgatev1.BeginRequest) { r.AttemptToken = "" }, "attempt_token"},
		{"token too long", func(r *idemgatev1.BeginRequest) { r.AttemptToken = strings.Repeat("t", 129) }, "attempt_token"},
		{"token not printable", func(r *idemgatev1.BeginRequest) { r.AttemptToken = "t\x00" }, "attempt_token"},
		{"no lease", func(r *idemgatev1.BeginRequest) { r.Lease = nil }, "lease"},
		{"lease under 1s", func(r *idemgatev1.BeginRequest) { r.Lease = durationpb.New(time.Millisecond) }, "lease"},
		{"invalid lease", func(r *idemgatev1.BeginRequest) { r.Lease = &durationpb.Duration{Seconds: 1, Nanos: -1} }, "lease"},
		{"lease over a day", func(r *idemgatev1.BeginRequest) {
			r.Lease, r.Retention = durationpb.New(25*time.Hour), durationpb.New(48*time.Hour)
		}, "lease"},
		{"no retention", func(r *idemgatev1.BeginRequest) { r.Retention = nil }, "retention"},
		{"retention under lease", func(r *idemgatev1.BeginRequest) { r.Retention = durationpb.New(5 * time.Second) }, "retention"},
		{"retention over a year", func(r *idemgatev1.BeginRequest) { r.Retention = durationpb.New(400 * 24 * time.Hour) }, "retention"},
		{"max_wait over a minute", func(r *idemgatev1.BeginRequest) { r.MaxWait = durationpb.New(2 * time.Minute) }, "max_wait"},
		{"negative max_wait", func(r *idemgatev1.BeginRequest) { r.MaxWait = durationpb.New(-time.Second) }, "max_wait"},
		{"unknown on_lost_outcome", func(r *idemgatev1.BeginRequest) { r.OnLostOutcome = idemgatev1.LostOutcomePolicy(7) }, "on_lost_outcome"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := &fakeStore{}
			req := validBegin()
			tt.mutate(req)
			_, err := dedupesvc.NewServer(store).Begin(context.Background(), req)
			wantInvalid(t, err, tt.field)
			if store.calls != 0 {
				t.Fatal("an invalid request reached the store")
			}
		})
	}
}

// TestBeginLeaseBounds: Begin's lease has Heartbeat's bound (MaxLease), and
// the retention, which must cover the lease, may still run to MaxRetention
// when the service's cap (WithMaxRetention) allows it.
func TestBeginLeaseBounds(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ lease, retention time.Duration }{
		{dedupesvc.MaxLease, dedupesvc.MaxLease},
		{dedupesvc.MaxLease, dedupesvc.MaxRetention},
		{dedupesvc.MinLease, dedupesvc.MaxRetention},
	} {
		store := &fakeStore{begin: dedupesvc.BeginResult{State: dedupesvc.BeginReserved, Epoch: 1}}
		req := validBegin()
		req.Lease, req.Retention = durationpb.New(tt.lease), durationpb.New(tt.retention)
		if _, err := dedupesvc.NewServer(store, dedupesvc.WithMaxRetention(dedupesvc.MaxRetention)).Begin(context.Background(), req); err != nil || store.calls != 1 {
			t.Errorf("Begin(lease %s, retention %s) = %v; want it accepted", tt.lease, tt.retention, err)
		}
	}
	req := validBegin()
	req.Lease, req.Retention = durationpb.New(dedupesvc.MaxLease+time.Second), durationpb.New(dedupesvc.MaxRetention)
	_, err := dedupesvc.NewServer(&fakeStore{}).Begin(context.Background(), req)
	wantInvalid(t, err, "lease")
}

func TestFinishAndReleaseValidation(t *testing.T) {
	t.Parallel()
	srv := dedupesvc.NewServer(&fakeStore{})
	ok := &anypb.Any{TypeUrl: "type.googleapis.com/x.Y"}
	finishes := map[string]struct {
		req   *idemgatev1.FinishRequest
		field string
	}{
		"no epoch":    {&idemgatev1.FinishRequest{Scope: "s", Key: "k", AttemptToken: "t", Outcome: ok}, "epoch"},
		"no outcome":  {&idemgatev1.FinishRequest{Scope: "s", Key: "k", AttemptToken: "t", Epoch: 1}, "outcome"},
		"no type url": {&idemgatev1.FinishRequest{Scope: "s", Key: "k", AttemptToken: "t", Epoch: 1, Outcome: &anypb.Any{Value: []byte("x")}}, "outcome.type_url"},
		"no key":      {&idemgatev1.FinishRequest{Scope: "s", AttemptToken: "t", Epoch: 1, Outcome: ok}, "key"},
	}
	for name, tt := range finishes {
		_, err := srv.Finish(context.Background(), tt.req)
		t.Run("Finish "+name, func(t *testing.T) { wantInvalid(t, err, tt.field) })
	}
	_, err := srv.Release(context.Background(), &idemgatev1.ReleaseRequest{Scope: "s", Key: "k", AttemptToken: "t"})
	wantInvalid(t, err, "epoch")
	_, err = srv.Heartbeat(context.Background(), &idemgatev1.HeartbeatRequest{Scope: "s", Key: "k", AttemptToken: "t", Epoch: 1, Lease: durationpb.New(time.Millisecond)})
	wantInvalid(t, err, "lease")
	_, err = srv.Heartbeat(context.Background(), &idemgatev1.HeartbeatRequest{Scope: "s", Key: "k", AttemptToken: "t", Lease: durationpb.New(time.Second)})
	wantInvalid(t, err, "epoch")
	_, err = srv.Resolve(context.Background(), &idemgatev1.ResolveRequest{Scope: "s", Key: "k"})
	wantInvalid(t, err, "resolution")
	_, err = srv.Resolve(context.Background(), &idemgatev1.ResolveRequest{Scope: "s", Key: "k", Resolution: &idemgatev1.ResolveRequest_Complete{Complete: &anypb.Any{}}})
	wantInvalid(t, err, "complete.type_url")
	_, err = srv.Resolve(context.Background(), &idemgatev1.ResolveRequest{Key: "k", Resolution: &idemgatev1.ResolveRequest_Release_{Release: &idemgatev1.ResolveRequest_Release{}}})
	wantInvalid(t, err, "scope")
}

func TestOutcomeOverTheLimitIsRefused(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	srv := dedupesvc.NewServer(store, dedupesvc.WithMaxOutcomeBytes(10))
	big := &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: make([]byte, 11)}
	_, err := srv.Finish(context.Background(), &idemgatev1.FinishRequest{Scope: "s", Key: "k", AttemptToken: "t", Epoch: 1, Outcome: big})
	if status.Code(err) != codes.InvalidArgument || grpcerr.Reason(err) != dedupesvc.ReasonOutcomeTooLarge {
		t.Fatalf("Finish over the limit: %v, want INVALID_ARGUMENT %s", err, dedupesvc.ReasonOutcomeTooLarge)
	}
	_, err = srv.Resolve(context.Background(), &idemgatev1.ResolveRequest{Scope: "s", Key: "k", Resolution: &idemgatev1.ResolveRequest_Complete{Complete: big}})
	if grpcerr.Reason(err) != dedupesvc.ReasonOutcomeTooLarge || store.calls != 0 {
		t.Fatalf("Resolve over the limit: %v (store calls %d), want %s and nothing stored", err, store.calls, dedupesvc.ReasonOutcomeTooLarge)
	}
	big.Value = big.Value[:10]
	if _, err := srv.Finish(context.Background(), &idemgatev1.FinishRequest{Scope: "s", Key: "k", AttemptToken: "t", Epoch: 1, Outcome: big}); err != nil {
		t.Fatalf("Finish at the limit: %v", err)
	}
}

func TestStoreErrorsAreMapped(t *testing.T) {
	t.Parallel()
	secret := errors.New(`pgstore: ERROR: duplicate key value violates unique constraint, Key (scope)=(other-tenant-secret)`)
	srv := dedupesvc.NewServer(&fakeStore{err: secret})
	_, err := srv.Begin(context.Background(), validBegin())
	if status.Code(err) != codes.Unavailable || grpcerr.Reason(err) != dedupesvc.ReasonStoreUnavailable {
		t.Fatalf("store failure: %v, want UNAVAILABLE %s", err, dedupesvc.ReasonStoreUnavailable)
	}
	if _, ok := grpcerr.RetryDelay(err); !ok {
		t.Error("UNAVAILABLE without RetryInfo")
	}
	if strings.Contains(err.Error(), "other-tenant-secret") {
		t.Fatalf("the driver's error leaked to the caller: %v", err)
	}

	release := &idemgatev1.ResolveRequest{Scope: "s", Key: "k", Resolution: &idemgatev1.ResolveRequest_Release_{Release: &idemgatev1.ResolveRequest_Release{}}}
	_, err = dedupesvc.NewServer(&fakeStore{err: dedupesvc.ErrNotUnknown}).Resolve(context.Background(), release)
	if status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != dedupesvc.ReasonRecordNotUnknown {
		t.Fatalf("not unknown: %v, want FAILED_PRECONDITION %s", err, dedupesvc.ReasonRecordNotUnknown)
	}
	_, err = dedupesvc.NewServer(&fakeStore{err: dedupesvc.ErrRecordNotFound}).Resolve(context.Background(), release)
	if status.Code(err) != codes.NotFound || grpcerr.Reason(err) != dedupesvc.ReasonRecordNotFound {
		t.Fatalf("not found: %v, want NOT_FOUND %s", err, dedupesvc.ReasonRecordNotFound)
	}

	srv = dedupesvc.NewServer(&fakeStore{err: dedupesvc.ErrNotHeld})
	_, err = srv.Finish(context.Background(), &idemgatev1.FinishRequest{Scope: "s", Key: "k", AttemptToken: "t", Epoch: 1, Outcome: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y"}})
	if status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != dedupesvc.ReasonReservationNotHeld {
		t.Fatalf("not held: %v, want FAILED_PRECONDITION %s", err, dedupesvc.ReasonReservationNotHeld)
	}
}

func wantInvalid(t *testing.T, err error, field string) {
	t.Helper()
	if status.Code(err) != codes.InvalidArgument || grpcerr.Reason(err) != dedupesvc.ReasonInvalidRequest {
		t.Fatalf("got %v, want INVALID_ARGUMENT %s", err, dedupesvc.ReasonInvalidRequest)
	}
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetMetadata()["field"] != field {
			t.Fatalf("error names field %q, want %q (%v)", info.GetMetadata()["field"], field, err)
		}
	}
}

// ReleaseLostBegins names 1 to MaxLostBegins attempts, each as Release
// would; a bad one is refused naming its place, and nothing reaches the
// store.
func TestReleaseLostBeginsValidation(t *testing.T) {
	t.Parallel()
	lost := func(n int) []*idemgatev1.ReleaseLostBeginsRequest_LostBegin {
		out := make([]*idemgatev1.ReleaseLostBeginsRequest_LostBegin, n)
		for i := range out {
			out[i] = &idemgatev1.ReleaseLostBeginsRequest_LostBegin{Scope: "/pkg.S/M", Key: fmt.Sprintf("order-%d", i), AttemptToken: "attempt-1"}
		}
		return out
	}
	tests := []struct {
		name   string
		lost   []*idemgatev1.ReleaseLostBeginsRequest_LostBegin
		mutate func([]*idemgatev1.ReleaseLostBeginsRequest_LostBegin)
		field  string
	}{
		{"none", nil, nil, "lost_begins"},
		{"over the limit", lost(dedupesvc.MaxLostBegins + 1), nil, "lost_begins"},
		{"no scope", lost(3), func(l []*idemgatev1.ReleaseLostBeginsRequest_LostBegin) { l[1].Scope = "" }, "lost_begins[1].scope"},
		{"key not printable", lost(3), func(l []*idemgatev1.ReleaseLostBeginsRequest_LostBegin) { l[2].Key = "a\nb" }, "lost_begins[2].key"},
		{"no token", lost(1), func(l []*idemgatev1.ReleaseLostBeginsRequest_LostBegin) { l[0].AttemptToken = "" }, "lost_begins[0].attempt_token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := &fakeStore{}
			if tt.mutate != nil {
				tt.mutate(tt.lost)
			}
			_, err := dedupesvc.NewServer(store).ReleaseLostBegins(context.Background(), &idemgatev1.ReleaseLostBeginsRequest{LostBegins: tt.lost})
			wantInvalid(t, err, tt.field)
			if store.calls != 0 {
				t.Fatal("an invalid request reached the store")
			}
		})
	}
	store := &fakeStore{}
	if _, err := dedupesvc.NewServer(store).ReleaseLostBegins(context.Background(), &idemgatev1.ReleaseLostBeginsRequest{LostBegins: lost(dedupesvc.MaxLostBegins)}); err != nil || store.calls != 1 {
		t.Fatalf("ReleaseLostBegins of %d attempts = %v with %d store calls, want one store call", dedupesvc.MaxLostBegins, err, store.calls)
	}
}

// A Begin whose store failed before sending anything of it (ErrNotSent) is
// answered DEDUPE_STORE_UNAVAILABLE with ErrorInfo metadata reserved=none,
// so its gate has nothing to follow up; not when the store may have sent
// it, and not on a retried try (an earlier try may have reserved).
func TestBeginThatReservedNothingSaysSo(t *testing.T) {
	t.Parallel()
	failed := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	for _, tc := range []struct {
		name     string
		err      error
		previous string
		want     string
	}{
		{"not sent, first try", dedupesvc.NotSent(failed), "", dedupesvc.ReservedNone},
		{"not sent, wrapped again", fmt.Errorf("pgstore: reserve or read: %w", dedupesvc.NotSent(failed)), "0", dedupesvc.ReservedNone},
		{"not sent, a retried try", dedupesvc.NotSent(failed), "1", ""},
		{"maybe sent", failed, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			if tc.previous != "" {
				ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("grpc-previous-rpc-attempts", tc.previous))
			}
			_, err := dedupesvc.NewServer(&fakeStore{err: tc.err}, dedupesvc.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))).Begin(ctx, validBegin())
			if status.Code(err) != codes.Unavailable || grpcerr.Reason(err) != dedupesvc.ReasonStoreUnavailable {
				t.Fatalf("Begin = %v, want UNAVAILABLE %s", err, dedupesvc.ReasonStoreUnavailable)
			}
			if got := errorInfo(t, err).GetMetadata()[dedupesvc.MetadataReserved]; got != tc.want {
				t.Fatalf("ErrorInfo metadata %s = %q, want %q", dedupesvc.MetadataReserved, got, tc.want)
			}
		})
	}
}

// blockingStore's Begin holds its place at the store until release closes;
// its Heartbeat answers at once.
type blockingStore struct {
	fakeStore
	entered chan struct{}
	release chan struct{}
}

func (s *blockingStore) Begin(ctx context.Context, _ dedupesvc.BeginParams) (dedupesvc.BeginResult, error) {
	s.entered <- struct{}{}
	select {
	case <-s.release:
	case <-ctx.Done():
		return dedupesvc.BeginResult{}, ctx.Err()
	}
	return dedupesvc.BeginResult{State: dedupesvc.BeginReserved, Epoch: 1, LeaseExpiresAt: time.Now().Add(time.Minute)}, nil
}

func (s *blockingStore) Heartbeat(context.Context, dedupesvc.HeartbeatParams) (time.Time, error) {
	return time.Now().Add(time.Minute), nil
}

// With WithMaxConcurrentBegins, Begins past the bound wait for a place while
// a Heartbeat goes straight to the store; one whose place does not come
// before its deadline nears is answered DEDUPE_STORE_UNAVAILABLE with
// reserved=none (it sent nothing), not left to its own deadline.
func TestBeginsPastTheirBoundWaitButRenewalsDoNot(t *testing.T) {
	t.Parallel()
	store := &blockingStore{entered: make(chan struct{}, 4), release: make(chan struct{})}
	srv := dedupesvc.NewServer(store, dedupesvc.WithMaxConcurrentBegins(1), dedupesvc.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := srv.Begin(ctx, validBegin())
		first <- err
	}()
	<-store.entered // the first Begin holds the only place

	hb := &idemgatev1.HeartbeatRequest{Scope: "/pkg.S/M", Key: "order-1", AttemptToken: "attempt-1", Epoch: 1, Lease: durationpb.New(10 * time.Second)}
	if _, err := srv.Heartbeat(context.Background(), hb); err != nil {
		t.Fatalf("Heartbeat while a Begin holds the only place: %v, want it answered", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	second := validBegin()
	second.Key = "order-2"
	_, err := srv.Begin(ctx, second)
	if ctx.Err() != nil {
		t.Fatalf("the waiting Begin was left to its own deadline (%v); want it answered before", err)
	}
	if status.Code(err) != codes.Unavailable || grpcerr.Reason(err) != dedupesvc.ReasonStoreUnavailable ||
		errorInfo(t, err).GetMetadata()[dedupesvc.MetadataReserved] != dedupesvc.ReservedNone {
		t.Fatalf("a Begin that found no place before its deadline = %v, want UNAVAILABLE %s with reserved=none", err, dedupesvc.ReasonStoreUnavailable)
	}
	select {
	case <-store.entered:
		t.Fatal("the Begin past the bound reached the store")
	default:
	}

	close(store.release)
	if err := <-first; err != nil {
		t.Fatalf("the first Begin: %v", err)
	}
	third := validBegin()
	third.Key = "order-3"
	if _, err := srv.Begin(context.Background(), third); err != nil {
		t.Fatalf("a Begin once the place is free: %v", err)
	}
}

// A store that fails every call is logged once, then at most once a second
// with how many failures went unlogged since: during an outage a replica
// logged one line per call, about 1,000 a second (issue 38), which buried
// the line that said what failed.
func TestStoreFailuresAreLoggedPaced(t *testing.T) {
	t.Parallel()
	var logs testlog.Buffer
	srv := dedupesvc.NewServer(&fakeStore{err: errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")},
		dedupesvc.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	for range 1000 {
		if _, err := srv.Begin(context.Background(), validBegin()); status.Code(err) != codes.Unavailable {
			t.Fatalf("Begin = %v, want UNAVAILABLE", err)
		}
	}
	if n := strings.Count(logs.String(), "dedupe store failed"); n < 1 || n > 100 {
		t.Fatalf("1,000 failed Begins logged %d lines, want 1 (at most one a second after the first)", n)
	}
	time.Sleep(1100 * time.Millisecond)
	if _, err := srv.Begin(context.Background(), validBegin()); status.Code(err) != codes.Unavailable {
		t.Fatalf("Begin = %v, want UNAVAILABLE", err)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "dedupe store failed") || strings.Contains(last, "unlogged_since_last=0") || !strings.Contains(last, "unlogged_since_last=") {
		t.Fatalf("the line a second later = %q, want the failure with how many went unlogged since the last line", last)
	}
}

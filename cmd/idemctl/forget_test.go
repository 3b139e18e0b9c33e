package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// fakeAdmin answers GetRecord with states in turn (the last one repeated)
// and ForgetRecord as the service would: an unsettled record is refused
// without force. It records the contexts and requests it is given.
type fakeAdmin struct {
	idemgatev1.AdminServiceClient // the RPCs forget does not call: nil, panic if called

	mu        sync.Mutex
	states    []string
	gets      int
	getCtxs   []context.Context
	forgets   []*idemgatev1.ForgetRecordRequest
	forgetErr error // the context's error, when ForgetRecord got a done one
}

func (f *fakeAdmin) state() string {
	return f.states[min(f.gets, len(f.states))-1]
}

func (f *fakeAdmin) GetRecord(ctx context.Context, req *idemgatev1.GetRecordRequest, _ ...grpc.CallOption) (*idemgatev1.GetRecordResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
	f.getCtxs = append(f.getCtxs, ctx)
	return &idemgatev1.GetRecordResponse{Record: &idemgatev1.Record{Ref: req.GetRef(), State: f.state(), Epoch: int64(f.gets)}}, nil
}

func (f *fakeAdmin) ForgetRecord(ctx context.Context, req *idemgatev1.ForgetRecordRequest, _ ...grpc.CallOption) (*idemgatev1.ForgetRecordResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgets = append(f.forgets, req)
	if err := ctx.Err(); err != nil {
		f.forgetErr = err
		return nil, status.FromContextError(err).Err()
	}
	// The record as it is now: after the last GetRecord, the next state.
	now := f.states[min(f.gets+1, len(f.states))-1]
	if (now == "in_flight" || now == "unknown") && !req.GetForce() {
		return nil, grpcerr.New(codes.FailedPrecondition, dedupesvc.ReasonRecordNotSettled, "the record is "+now, map[string]string{"state": now}, 0)
	}
	return &idemgatev1.ForgetRecordResponse{Record: &idemgatev1.Record{Ref: req.GetRef(), State: now}}, nil
}

// slowAnswer is stdin whose answer arrives only once ready() is closed.
type slowAnswer struct {
	ready func() <-chan struct{}
	r     io.Reader
}

func (s *slowAnswer) Read(p []byte) (int, error) {
	<-s.ready()
	return s.r.Read(p)
}

func runForget(admin idemgatev1.AdminServiceClient, rpcCtx func() (context.Context, context.CancelFunc), stdin io.Reader, force, yes bool) (int, string) {
	var stdout, stderr bytes.Buffer
	ref := &idemgatev1.RecordRef{Namespace: "payments", Scope: scope, Key: "order-1"}
	code := forget(rpcCtx, admin, ref, force, yes, stdin, &stdout, &stderr, func(err error) int { return failRPC(&stderr, "fake", err) })
	return code, stdout.String() + stderr.String()
}

// The operator may take longer to type the key than an RPC may take: the
// answer arrives after GetRecord's context (a short timeout here) has
// expired, and ForgetRecord still runs, on a context of its own.
func TestForgetGivesEachRPCItsOwnTimeout(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var first context.Context
	rpcCtx := func() (context.Context, context.CancelFunc) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			t.Cleanup(cancel)
			first = ctx
			return ctx, func() {} // expires by itself, whatever forget does
		}
		return context.WithTimeout(context.Background(), time.Minute)
	}
	// The answer comes once the first RPC's timeout has passed.
	firstDone := func() <-chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		return first.Done()
	}
	admin := &fakeAdmin{states: []string{"completed"}}
	code, out := runForget(admin, rpcCtx, &slowAnswer{ready: firstDone, r: strings.NewReader("order-1\n")}, false, false)
	if code != 0 || !strings.Contains(out, "forgot") || admin.forgetErr != nil {
		t.Fatalf("exit %d, ForgetRecord's context: %v\n%s\nwant the record forgotten: the prompt's wait must not use up ForgetRecord's timeout", code, admin.forgetErr, out)
	}
}

// -force is sent only when the record shown to the operator needed it: a
// record that was settled when shown is never forced away.
func TestForgetForcesOnlyTheStateTheOperatorSaw(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		shown     string
		wantForce bool
	}{
		{"completed", false},
		{"released", false},
		{"in_flight", true},
		{"unknown", true},
	} {
		admin := &fakeAdmin{states: []string{tc.shown}}
		code, out := runForget(admin, rpcContext, strings.NewReader(""), true, true)
		if code != 0 || len(admin.forgets) != 1 || admin.forgets[0].GetForce() != tc.wantForce {
			t.Errorf("-force -yes on a record shown %s: exit %d, requests %v; want force=%v\n%s", tc.shown, code, admin.forgets, tc.wantForce, out)
		}
	}
}

// A record settled when shown that became unsettled while the operator
// typed the key is not forgotten, even with -force: idemctl says it
// changed and shows it again.
func TestForgetOfARecordThatChangedWhileTheOperatorTyped(t *testing.T) {
	t.Parallel()
	for _, force := range []bool{false, true} {
		admin := &fakeAdmin{states: []string{"completed", "in_flight"}}
		code, out := runForget(admin, rpcContext, strings.NewReader("order-1\n"), force, false)
		if code != 1 || len(admin.forgets) != 1 || admin.forgets[0].GetForce() || admin.gets != 2 ||
			!strings.Contains(out, "changed") || !strings.Contains(out, "not forgotten") || strings.Contains(out, "forgot ") {
			t.Errorf("force=%v: exit %d, %d gets, requests %v; want 1, the record not forced, shown again\n%s", force, code, admin.gets, admin.forgets, out)
		}
		// Shown again: its new state and what forgetting it would do.
		if _, now, _ := strings.Cut(out, "changed"); !strings.Contains(now, "in_flight") || !strings.Contains(now, "NOW") {
			t.Errorf("force=%v: the record is not shown again as it is now:\n%s", force, out)
		}
	}
}

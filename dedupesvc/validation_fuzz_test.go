package dedupesvc_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/keys"
)

// FuzzRequestValidation sends arbitrary Dedupe requests: each is refused
// with INVALID_ARGUMENT and a reason before the store sees it, or reaches
// the store only when it is well formed. Nothing panics.
func FuzzRequestValidation(f *testing.F) {
	begin, _ := proto.Marshal(validBegin())
	f.Add(byte(0), begin)
	finish, _ := proto.Marshal(&idemgatev1.FinishRequest{Scope: "s", Key: "k", AttemptToken: "t", Epoch: 1, Outcome: &anypb.Any{TypeUrl: "x/y.Z", Value: []byte("v")}})
	f.Add(byte(1), finish)
	heartbeat, _ := proto.Marshal(&idemgatev1.HeartbeatRequest{Scope: "s", Key: "k", AttemptToken: "t", Epoch: 1, Lease: durationpb.New(1e9)})
	f.Add(byte(2), heartbeat)
	resolve, _ := proto.Marshal(&idemgatev1.ResolveRequest{Scope: "s", Key: "k", Resolution: &idemgatev1.ResolveRequest_Release_{Release: &idemgatev1.ResolveRequest_Release{}}})
	f.Add(byte(3), resolve)

	f.Fuzz(func(t *testing.T, rpc byte, wire []byte) {
		store := &fakeStore{begin: dedupesvc.BeginResult{State: dedupesvc.BeginInFlight}}
		srv := dedupesvc.NewServer(store)
		ctx := context.Background()
		var (
			err               error
			scope, key, token string
		)
		switch rpc % 4 {
		case 0:
			req := &idemgatev1.BeginRequest{}
			if proto.Unmarshal(wire, req) != nil {
				return
			}
			req.MaxWait = nil // a fuzzed wait would only slow the fuzzer down
			_, err = srv.Begin(ctx, req)
			scope, key, token = req.GetScope(), req.GetKey(), req.GetAttemptToken()
			if err == nil && (len(req.GetFingerprint()) != 32 || req.GetLease().AsDuration() < dedupesvc.MinLease || req.GetRetention().AsDuration() < req.GetLease().AsDuration()) {
				t.Fatalf("Begin accepted %v", req)
			}
		case 1:
			req := &idemgatev1.FinishRequest{}
			if proto.Unmarshal(wire, req) != nil {
				return
			}
			_, err = srv.Finish(ctx, req)
			scope, key, token = req.GetScope(), req.GetKey(), req.GetAttemptToken()
			if err == nil && (req.GetEpoch() <= 0 || req.GetOutcome().GetTypeUrl() == "") {
				t.Fatalf("Finish accepted %v", req)
			}
		case 2:
			req := &idemgatev1.HeartbeatRequest{}
			if proto.Unmarshal(wire, req) != nil {
				return
			}
			_, err = srv.Heartbeat(ctx, req)
			scope, key, token = req.GetScope(), req.GetKey(), req.GetAttemptToken()
		case 3:
			req := &idemgatev1.ResolveRequest{}
			if proto.Unmarshal(wire, req) != nil {
				return
			}
			_, err = srv.Resolve(ctx, req)
			scope, key, token = req.GetScope(), req.GetKey(), "resolve"
		}
		if err != nil {
			if status.Code(err) != codes.InvalidArgument || grpcerr.Reason(err) == "" {
				t.Fatalf("refused with %v, want INVALID_ARGUMENT with a reason", err)
			}
			if store.calls != 0 {
				t.Fatal("a refused request reached the store")
			}
			return
		}
		if store.calls != 1 || scope == "" || len(scope) > dedupesvc.MaxScopeBytes || keys.Validate(key) != nil || token == "" || !keys.Printable(token) {
			t.Fatalf("an accepted request (store calls %d) is malformed: scope %q key %q token %q", store.calls, scope, key, token)
		}
	})
}

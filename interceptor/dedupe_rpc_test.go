package interceptor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
)

// The Dedupe RPCs are safe to retry, over the real gRPC service.
func TestDedupeRPCsAreSafeToRetry(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()
	fp := sha256.Sum256([]byte("request"))
	beginReq := &idemgatev1.BeginRequest{
		Scope: "/x.S/M", Key: "k", Fingerprint: fp[:], AttemptToken: "attempt-1",
		Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour),
	}

	// The first answer is lost on the way back; the attempt asks again.
	first, err := h.Dedupe.Begin(ctx, beginReq)
	if err != nil {
		t.Fatal(err)
	}
	again, err := h.Dedupe.Begin(ctx, beginReq)
	if err != nil {
		t.Fatal(err)
	}
	if again.GetReserved() == nil || again.GetReserved().GetEpoch() != first.GetReserved().GetEpoch() {
		t.Fatalf("retried Begin = %v, want reserved at epoch %d again", again, first.GetReserved().GetEpoch())
	}
	epoch := first.GetReserved().GetEpoch()

	outcome, _ := anypb.New(&testingv1.MutateResponse{Payload: "first"})
	other, _ := anypb.New(&testingv1.MutateResponse{Payload: "second"})
	intruder := &idemgatev1.FinishRequest{Scope: "/x.S/M", Key: "k", AttemptToken: "attempt-2", Epoch: epoch, Outcome: other}
	if _, err := h.Dedupe.Finish(ctx, intruder); err == nil {
		t.Fatal("a Finish from an attempt without the reservation succeeded")
	} else {
		wantStatus(t, err, codes.FailedPrecondition, dedupesvc.ReasonReservationNotHeld)
	}

	finish := &idemgatev1.FinishRequest{Scope: "/x.S/M", Key: "k", AttemptToken: "attempt-1", Epoch: epoch, Outcome: outcome}
	if _, err := h.Dedupe.Finish(ctx, finish); err != nil {
		t.Fatal(err)
	}
	retried := proto.Clone(finish).(*idemgatev1.FinishRequest)
	retried.Outcome = other
	if _, err := h.Dedupe.Finish(ctx, retried); err != nil {
		t.Fatalf("retried Finish: %v, want success", err)
	}
	if _, err := h.Dedupe.Finish(ctx, intruder); err == nil {
		t.Fatal("a Finish from an attempt without the reservation succeeded after completion")
	}

	beginReq.AttemptToken = "attempt-3"
	replay, err := h.Dedupe.Begin(ctx, beginReq)
	if err != nil {
		t.Fatal(err)
	}
	if got := replay.GetCompleted().GetOutcome(); !proto.Equal(got, outcome) || !bytes.Equal(got.GetValue(), outcome.GetValue()) {
		t.Fatalf("stored outcome %v, want the first Finish's %v", got, outcome)
	}
}

func TestStoredOutcomeOfAnotherTypeIsNotRerun(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()
	req := &testingv1.MutateRequest{Payload: "x"}
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	fp := sha256.Sum256(b)
	begun, err := h.Dedupe.Begin(ctx, &idemgatev1.BeginRequest{
		Scope: mutateInfo.FullMethod, Key: "k-8", Fingerprint: fp[:], AttemptToken: "older-binary",
		Lease: durationpb.New(interceptor.DefaultLease), Retention: durationpb.New(interceptor.DefaultRetention),
	})
	if err != nil {
		t.Fatal(err)
	}
	wrong, _ := anypb.New(&emptypb.Empty{})
	if _, err := h.Dedupe.Finish(ctx, &idemgatev1.FinishRequest{
		Scope: mutateInfo.FullMethod, Key: "k-8", AttemptToken: "older-binary", Epoch: begun.GetReserved().GetEpoch(), Outcome: wrong,
	}); err != nil {
		t.Fatal(err)
	}

	r := h.mutate(withKey("k-8"), req)
	wantStatus(t, r.err, codes.Internal, idemgate.ReasonOutcomeTypeMismatch)
	if h.svc.Executions() != 0 {
		t.Fatal("the handler ran again for a key with a stored outcome")
	}
}

func TestNewRejectsInconsistentPolicies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		method  *descriptorpb.MethodDescriptorProto
		wantErr string
	}{
		{"mutating and NO_SIDE_EFFECTS", method("Charge", false, descriptorpb.MethodOptions_NO_SIDE_EFFECTS, &idemgatev1.MethodPolicy{Mutating: true}),
			"marked both mutating and idempotency_level = NO_SIDE_EFFECTS"},
		{"streaming and mutating", method("Stream", true, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN, &idemgatev1.MethodPolicy{Mutating: true}),
			"only unary methods can be gated"},
		{"retention under lease", method("Short", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
			&idemgatev1.MethodPolicy{Mutating: true, Retention: durationpb.New(time.Minute), Lease: durationpb.New(time.Hour)}), "shorter than its lease"},
		{"lease under 1s", method("Tiny", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
			&idemgatev1.MethodPolicy{Mutating: true, Lease: durationpb.New(time.Millisecond)}), "lease 1ms is outside 1s to 24h0m0s"},
		{"lease over 24h, the longest the Dedupe service renews to", method("Long", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
			&idemgatev1.MethodPolicy{Mutating: true, Lease: durationpb.New(25 * time.Hour), Retention: durationpb.New(48 * time.Hour)}), "lease 25h0m0s is outside 1s to 24h0m0s"},
		{"execution_timeout under 1s", method("Quick", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
			&idemgatev1.MethodPolicy{Mutating: true, ExecutionTimeout: durationpb.New(time.Millisecond)}), "execution_timeout 1ms is outside 1s to 24h0m0s"},
		{"unknown unknown_code", method("Unknowns", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
			&idemgatev1.MethodPolicy{Mutating: true, UnknownCodes: []string{"Internal"}}), `unknown_codes has "Internal"`},
		{"a code both final and unknown", method("Both", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
			&idemgatev1.MethodPolicy{Mutating: true, ReplayCodes: []string{"INTERNAL"}, UnknownCodes: []string{"INTERNAL"}}), "INTERNAL in both replay_codes and unknown_codes"},
		{"action with the scope separator", method("Piped", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
			&idemgatev1.MethodPolicy{Mutating: true, Action: "charge|v2"}), `action "charge|v2" must not contain "|"`},
		{"action with a control character", method("Ctl", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
			&idemgatev1.MethodPolicy{Mutating: true, Action: "charge\x1fv2"}), "must be printable ASCII"},
		{"unknown replay code", method("Codes", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
			&idemgatev1.MethodPolicy{Mutating: true, ReplayCodes: []string{"invalid_argument"}}), `replay_codes has "invalid_argument"`},
		{"OK as a replay code", method("Ok", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
			&idemgatev1.MethodPolicy{Mutating: true, ReplayCodes: []string{"OK"}}), `replay_codes has "OK"`},
		{"max_wait over 60s", method("Wait", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
			&idemgatev1.MethodPolicy{Mutating: true, MaxWait: durationpb.New(2 * time.Minute)}), "max_wait 2m0s is outside"},
		{"finish not a FinishPolicy", method("Finish", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
			&idemgatev1.MethodPolicy{Mutating: true, Finish: idemgatev1.FinishPolicy(7)}), "policy finish 7 is not a FinishPolicy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			files := filesWith(t, tt.method)
			_, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithFiles(files))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "bad.v1.BadService."+tt.method.GetName()) {
				t.Fatalf("New: %v, want an error naming bad.v1.BadService.%s and %q", err, tt.method.GetName(), tt.wantErr)
			}
		})
	}

	t.Run("a reconciler for an ungated method", func(t *testing.T) {
		t.Parallel()
		files := filesWith(t, method("Get", false, descriptorpb.MethodOptions_NO_SIDE_EFFECTS, nil))
		_, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithFiles(files),
			interceptor.WithReconciler("/bad.v1.BadService/Get", func(context.Context, string, proto.Message) (idemgate.Resolution, error) {
				return idemgate.StillUnknown(), nil
			}))
		if err == nil || !strings.Contains(err.Error(), "/bad.v1.BadService/Get, which is not a gated method") {
			t.Fatalf("New: %v, want the reconciler refused", err)
		}
	})

	t.Run("two methods sharing an action with different responses", func(t *testing.T) {
		t.Parallel()
		other := method("ChargeV2", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN, &idemgatev1.MethodPolicy{Mutating: true, Action: "charge"})
		other.OutputType = proto.String(".google.protobuf.Any")
		files := filesWith(t, method("Charge", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN, &idemgatev1.MethodPolicy{Mutating: true, Action: "charge"}), other)
		_, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithFiles(files))
		if err == nil || !strings.Contains(err.Error(), `share the action "charge" but return google.protobuf.Empty and google.protobuf.Any`) {
			t.Fatalf("New: %v, want the shared action refused", err)
		}
	})

	t.Run("code names are google.rpc.Code's, and the old CANCELED still reads", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct{ name, shown string }{{"CANCELLED", "CANCELLED"}, {"CANCELED", "CANCELLED"}} {
			files := filesWith(t, method("Charge", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN, &idemgatev1.MethodPolicy{
				Mutating: true, ReplayCodes: []string{"NOT_FOUND"}, UnknownCodes: []string{c.name, "DEADLINE_EXCEEDED"},
			}))
			g, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithFiles(files))
			if err != nil {
				t.Fatalf("unknown_codes [%s]: %v", c.name, err)
			}
			if got := g.Policy("/bad.v1.BadService/Charge").String(); !strings.Contains(got, "unknown_codes=["+c.shown+" DEADLINE_EXCEEDED]") {
				t.Errorf("unknown_codes [%s] shows as %s, want %s", c.name, got, c.shown)
			}
		}
	})

	t.Run("a consistent file builds and gates only the mutating method", func(t *testing.T) {
		t.Parallel()
		files := filesWith(t,
			method("Charge", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN, &idemgatev1.MethodPolicy{
				Mutating: true, Lease: durationpb.New(30 * time.Second), ReplayCodes: []string{"NOT_FOUND", "FAILED_PRECONDITION"},
				OnLostOutcome: idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_REEXECUTE, MaxWait: durationpb.New(0),
				Finish: idemgatev1.FinishPolicy_FINISH_POLICY_AFTER_REPLY,
			}),
			method("Get", false, descriptorpb.MethodOptions_NO_SIDE_EFFECTS, nil))
		g, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithFiles(files))
		if err != nil {
			t.Fatal(err)
		}
		if got := g.Policy("/bad.v1.BadService/Charge").String(); got != "gated(action=/bad.v1.BadService/Charge, retention=24h0m0s, lease=30s, on_lost_outcome=reexecute, replay_codes=[NOT_FOUND FAILED_PRECONDITION], unknown_codes=[], max_wait=0s, keyless=reject, execution_timeout=1m0s, finish=after_reply)" {
			t.Errorf("Charge policy %s", got)
		}
		if got := g.Policy("/bad.v1.BadService/Get").String(); got != "ungated" {
			t.Errorf("Get policy %s", got)
		}
	})
}

func method(name string, streaming bool, level descriptorpb.MethodOptions_IdempotencyLevel, policy *idemgatev1.MethodPolicy) *descriptorpb.MethodDescriptorProto {
	opts := &descriptorpb.MethodOptions{}
	if level != descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN {
		opts.IdempotencyLevel = level.Enum()
	}
	if policy != nil {
		proto.SetExtension(opts, idemgatev1.E_Policy, policy)
	}
	return &descriptorpb.MethodDescriptorProto{
		Name:            proto.String(name),
		InputType:       proto.String(".google.protobuf.Empty"),
		OutputType:      proto.String(".google.protobuf.Empty"),
		ServerStreaming: proto.Bool(streaming),
		Options:         opts,
	}
}

// filesWith builds a registry holding one service with the given methods.
func filesWith(t *testing.T, methods ...*descriptorpb.MethodDescriptorProto) *protoregistry.Files {
	t.Helper()
	fdp := &descriptorpb.FileDescriptorProto{
		Name:       proto.String("bad/v1/bad.proto"),
		Package:    proto.String("bad.v1"),
		Syntax:     proto.String("proto3"),
		Dependency: []string{"google/protobuf/empty.proto", "google/protobuf/any.proto"},
		Service:    []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("BadService"), Method: methods}},
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	files := &protoregistry.Files{}
	if err := files.RegisterFile(fd); err != nil {
		t.Fatal(err)
	}
	return files
}

package connectgate_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/connectgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/gen/idemgate/testing/v1/testingv1connect"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
)

// One execution per key over each protocol: the duplicate gets the stored
// response, equal to the first in its deterministic encoding, with the
// handler's headers and trailers, the replay headers, and no second run.
func TestOncePerKeyReplaysTheStoredResponse(t *testing.T) {
	t.Parallel()
	hs := setup(t, nil)
	ctx := testCtx(t)
	for i, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			client := hs.client(p.opts...)
			key := "once-" + p.name
			msg := &testingv1.MutateRequest{Payload: "charge-" + p.name,
				SetHeader:  []*testingv1.MetadataPair{{Key: "x-charge-id", Value: []byte("ch_1")}, {Key: "x-charge-id", Value: []byte("ch_1b")}},
				SetTrailer: []*testingv1.MetadataPair{{Key: "x-settled", Value: []byte("yes")}}}
			first, err := client.Mutate(ctx, keyed(key, msg))
			if err != nil {
				t.Fatal(err)
			}
			if first.Msg.GetExecution() != int64(i+1) || first.Msg.GetKey() != key || first.Msg.GetEpoch() < 1 || !strings.HasPrefix(first.Msg.GetDownstreamKey(), "idg_") {
				t.Fatalf("first response %v", first.Msg)
			}
			if first.Header().Get(idemgate.ReplayedHeader) != "" || first.Header().Get(idemgate.ExpiresAtHeader) == "" {
				t.Fatalf("first answer's headers %v: want expires-at and no replayed", first.Header())
			}
			again, err := client.Mutate(ctx, keyed(key, msg))
			if err != nil {
				t.Fatal(err)
			}
			want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(first.Msg)
			got, _ := proto.MarshalOptions{Deterministic: true}.Marshal(again.Msg)
			if !bytes.Equal(want, got) {
				t.Fatalf("replay %v, want the stored %v", again.Msg, first.Msg)
			}
			if hs.h.executions.Load() != int64(i+1) {
				t.Fatalf("%d executions after a duplicate, want %d", hs.h.executions.Load(), i+1)
			}
			h := again.Header()
			if h.Get(idemgate.ReplayedHeader) != "true" || h.Get(idemgate.OriginalTimeHeader) == "" || h.Get(idemgate.ExpiresAtHeader) == "" {
				t.Fatalf("replay headers %v: want replayed, original-time and expires-at", h)
			}
			if got := h.Values("X-Charge-Id"); len(got) != 2 || got[0] != "ch_1" || got[1] != "ch_1b" {
				t.Fatalf("replayed x-charge-id %q, want the handler's [ch_1 ch_1b]", got)
			}
			if got := again.Trailer().Get("X-Settled"); got != "yes" {
				t.Fatalf("replayed trailer x-settled %q (trailer %v), want yes", got, again.Trailer())
			}
		})
	}
}

// The Connect protocol's JSON, as curl sends it: the replay's body is the
// first answer's, byte for byte.
func TestConnectJSONReplayIsByteIdentical(t *testing.T) {
	t.Parallel()
	hs := setup(t, nil)
	post := func() (string, http.Header) {
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, hs.url+testingv1connect.TestServiceMutateProcedure,
			strings.NewReader(`{"payload":"json","labels":{"b":"2","a":"1"}}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "json-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		return string(body), resp.Header
	}
	first, _ := post()
	again, header := post()
	if first != again || header.Get("Idempotency-Replayed") != "true" {
		t.Fatalf("replay %s (headers %v), want the first body %s, replayed", again, header, first)
	}
	if hs.h.executions.Load() != 1 {
		t.Fatalf("%d executions, want 1", hs.h.executions.Load())
	}
}

// Concurrent duplicates run the handler once: every answer is that
// execution's response or IDEMPOTENCY_IN_FLIGHT.
func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	hs := setup(t, nil)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for i := range 8 {
		p := protocols[i%len(protocols)]
		wg.Go(func() {
			resp, err := hs.client(p.opts...).Mutate(ctx, keyed("concurrent", &testingv1.MutateRequest{Payload: "c", Delay: durationpb.New(200 * time.Millisecond)}))
			if err != nil {
				var ce *connect.Error
				if !errors.As(err, &ce) || ce.Code() != connect.CodeAborted {
					t.Errorf("%s: %v, want the response or ABORTED", p.name, err)
				}
				return
			}
			if resp.Msg.GetExecution() != 1 {
				t.Errorf("%s: execution %d, want 1", p.name, resp.Msg.GetExecution())
			}
		})
	}
	wg.Wait()
	if n := hs.h.executions.Load(); n != 1 {
		t.Fatalf("%d executions for one key, want 1", n)
	}
}

// A call without a key, and a key reused with another request, are refused
// before the handler runs, with the reason in the error details.
func TestKeyMissingAndReused(t *testing.T) {
	t.Parallel()
	hs := setup(t, nil)
	ctx := testCtx(t)
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			client := hs.client(p.opts...)
			_, err := client.Mutate(ctx, keyed("", &testingv1.MutateRequest{Payload: "x"}))
			wantError(t, err, connect.CodeInvalidArgument, idemgate.ReasonKeyMissing)
			key := "reused-" + p.name
			if _, err := client.Mutate(ctx, keyed(key, &testingv1.MutateRequest{Payload: "first"})); err != nil {
				t.Fatal(err)
			}
			_, err = client.Mutate(ctx, keyed(key, &testingv1.MutateRequest{Payload: "other"}))
			wantError(t, err, connect.CodeFailedPrecondition, idemgate.ReasonKeyReused)
			// The key field carries the key as well as the header.
			if _, err := client.Mutate(ctx, keyed("", &testingv1.MutateRequest{Payload: "field", RequestId: "field-" + p.name})); err != nil {
				t.Fatalf("a key in request_id: %v", err)
			}
			_, err = client.Mutate(ctx, keyed("header-"+p.name, &testingv1.MutateRequest{Payload: "field", RequestId: "field-other"}))
			wantError(t, err, connect.CodeInvalidArgument, idemgate.ReasonKeyConflict)
		})
	}
	if n := hs.h.executions.Load(); n != int64(2*len(protocols)) {
		t.Fatalf("%d executions, want %d (one per accepted key)", n, 2*len(protocols))
	}
}

// A final error is stored and replayed with its code, message, details and
// the metadata the handler put on it.
func TestFinalErrorReplays(t *testing.T) {
	t.Parallel()
	hs := setup(t, nil)
	ctx := testCtx(t)
	client := hs.client(connect.WithGRPC())
	msg := &testingv1.MutateRequest{Payload: "declined", FailCode: int32(codes.FailedPrecondition), FailDetail: "CARD_DECLINED",
		SetHeader: []*testingv1.MetadataPair{{Key: "x-decline", Value: []byte("insufficient")}}}
	_, first := client.MutateReplayErrors(ctx, keyed("declined", msg))
	wantError(t, first, connect.CodeFailedPrecondition, "CARD_DECLINED")
	_, again := client.MutateReplayErrors(ctx, keyed("declined", msg))
	wantError(t, again, connect.CodeFailedPrecondition, "CARD_DECLINED")
	var ce *connect.Error
	errors.As(again, &ce)
	if ce.Meta().Get(idemgate.ReplayedHeader) != "true" || ce.Meta().Get("X-Decline") != "insufficient" || ce.Message() != "handler failing on request" {
		t.Fatalf("replayed error %v with meta %v: want the handler's message and x-decline, replayed", ce, ce.Meta())
	}
	if n := hs.h.executions.Load(); n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
}

// A caller that gives up does not stop the handler: it completes, its
// outcome is stored, and the caller's retry replays it.
func TestCallerGivesUpTheRetryReplays(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	h := &handler{provider: func(ctx context.Context) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	hs := setup(t, h)
	client := hs.client(connect.WithGRPC())
	msg := &testingv1.MutateRequest{Payload: "gives-up"}
	callCtx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() {
		_, err := client.Mutate(callCtx, keyed("gives-up", msg))
		done <- err
	}()
	<-h.Started("gives-up")
	cancel()
	if err := <-done; connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("the cancelled call: %v, want CANCELED", err)
	}
	close(release)
	ctx := testCtx(t)
	for {
		resp, err := client.Mutate(ctx, keyed("gives-up", msg))
		if connect.CodeOf(err) == connect.CodeAborted {
			continue // still in flight past max_wait on a slow machine
		}
		if err != nil {
			t.Fatal(err)
		}
		if resp.Msg.GetExecution() != 1 || resp.Header().Get(idemgate.ReplayedHeader) != "true" {
			t.Fatalf("retry %v (headers %v), want the replayed execution 1", resp.Msg, resp.Header())
		}
		break
	}
	if n := h.executions.Load(); n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
}

// With the Dedupe service down a gated call fails closed: UNAVAILABLE
// (IDEMPOTENCY_STORE_UNAVAILABLE) with RetryInfo, the handler not run.
func TestDedupeDownFailsClosed(t *testing.T) {
	t.Parallel()
	// The lost Begins' follow-ups give up soon, so Close does not wait long.
	hs := setup(t, nil, connectgate.WithFinishRetryBudget(2*time.Second))
	if err := hs.gate.CheckDedupe(testCtx(t)); err != nil {
		t.Fatalf("CheckDedupe with the Dedupe service up: %v", err)
	}
	hs.stack.DedupeServer.Stop()
	if err := hs.gate.CheckDedupe(testCtx(t)); err == nil {
		t.Fatal("CheckDedupe with the Dedupe service down: nil")
	}
	for _, p := range protocols {
		_, err := hs.client(p.opts...).MutateNoWait(testCtx(t), keyed("down-"+p.name, &testingv1.MutateRequest{Payload: "down"}))
		if retry := wantError(t, err, connect.CodeUnavailable, idemgate.ReasonStoreUnavailable); retry.GetRetryDelay() == nil {
			t.Fatalf("%s: no RetryInfo on %v", p.name, err)
		}
	}
	if n := hs.h.executions.Load(); n != 0 {
		t.Fatalf("%d executions without a Dedupe service, want 0", n)
	}
}

// FINISH_POLICY_AFTER_REPLY: the caller is answered before the outcome is
// stored; a duplicate waits for it and replays it.
func TestAfterReply(t *testing.T) {
	t.Parallel()
	hs := setup(t, nil)
	ctx := testCtx(t)
	client := hs.client()
	first, err := client.MutateAfterReply(ctx, keyed("after", &testingv1.MutateRequest{Payload: "after"}))
	if err != nil {
		t.Fatal(err)
	}
	if first.Header().Get(idemgate.ExpiresAtHeader) == "" {
		t.Fatalf("first answer's headers %v, want expires-at", first.Header())
	}
	again, err := client.MutateAfterReply(ctx, keyed("after", &testingv1.MutateRequest{Payload: "after"}))
	if err != nil {
		t.Fatal(err)
	}
	if again.Msg.GetExecution() != 1 || again.Header().Get(idemgate.ReplayedHeader) != "true" {
		t.Fatalf("duplicate %v (headers %v), want the replayed execution 1", again.Msg, again.Header())
	}
	if n := hs.h.executions.Load(); n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
}

// A keyless call under KEYLESS_POLICY_FINGERPRINT is deduplicated on its
// fingerprint and says so.
func TestKeylessFingerprint(t *testing.T) {
	t.Parallel()
	hs := setup(t, nil)
	ctx := testCtx(t)
	client := hs.client()
	first, err := client.MutateKeyless(ctx, keyed("", &testingv1.MutateRequest{Payload: "keyless"}))
	if err != nil {
		t.Fatal(err)
	}
	again, err := client.MutateKeyless(ctx, keyed("", &testingv1.MutateRequest{Payload: "keyless"}))
	if err != nil {
		t.Fatal(err)
	}
	if first.Header().Get(idemgate.KeyDerivedHeader) != "true" || again.Msg.GetExecution() != 1 || hs.h.executions.Load() != 1 {
		t.Fatalf("keyless duplicate %v (headers %v, %d executions), want one execution, key derived", again.Msg, first.Header(), hs.h.executions.Load())
	}
}

// Ungated procedures and streams pass through: no key needed.
func TestUngatedAndStreamsPassThrough(t *testing.T) {
	t.Parallel()
	hs := setup(t, nil)
	ctx := testCtx(t)
	client := hs.client(connect.WithGRPC())
	if _, err := client.Unmarked(ctx, keyed("", &testingv1.MutateRequest{Payload: "u"})); err != nil {
		t.Fatalf("Unmarked without a key: %v", err)
	}
	stream, err := client.Watch(ctx, keyed("", &testingv1.MutateRequest{Payload: "w"}))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for stream.Receive() {
		n++
	}
	if err := stream.Err(); err != nil || n != 2 {
		t.Fatalf("Watch: %d messages, %v; want 2", n, err)
	}
}

// A streaming method marked mutating is refused at construction.
func TestNewRefusesAMutatingStream(t *testing.T) {
	t.Parallel()
	opts := &descriptorpb.MethodOptions{}
	proto.SetExtension(opts, idemgatev1.E_Policy, &idemgatev1.MethodPolicy{Mutating: true})
	files := filesWith(t, &descriptorpb.MethodDescriptorProto{Name: proto.String("Stream"), InputType: proto.String(".google.protobuf.Empty"),
		OutputType: proto.String(".google.protobuf.Empty"), ServerStreaming: proto.Bool(true), Options: opts})
	_, err := connectgate.New(idemgatev1.NewDedupeServiceClient(nil), connectgate.WithFiles(files))
	if err == nil || !strings.Contains(err.Error(), "only unary methods can be gated") {
		t.Fatalf("New: %v, want the streaming method refused", err)
	}
}

// One key over gRPC against the interceptor and over Connect against
// connectgate, on one Dedupe service, is one action: the second transport
// replays the first's outcome, both ways.
func TestOneKeyAcrossGRPCAndConnect(t *testing.T) {
	t.Parallel()
	hs := setup(t, nil)
	ctx := testCtx(t)
	grpcClient := testingv1.NewTestServiceClient(hs.stack.Tool)
	msg := &testingv1.MutateRequest{Payload: "cross"}

	fromGRPC, err := grpcClient.Mutate(metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, "cross-1"), msg)
	if err != nil {
		t.Fatal(err)
	}
	overConnect, err := hs.client().Mutate(ctx, keyed("cross-1", msg))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(overConnect.Msg, fromGRPC) || overConnect.Header().Get(idemgate.ReplayedHeader) != "true" || hs.h.executions.Load() != 0 {
		t.Fatalf("over Connect %v (headers %v, %d Connect executions), want the gRPC outcome %v replayed", overConnect.Msg, overConnect.Header(), hs.h.executions.Load(), fromGRPC)
	}

	fromConnect, err := hs.client(connect.WithGRPCWeb()).Mutate(ctx, keyed("cross-2", msg))
	if err != nil {
		t.Fatal(err)
	}
	var header metadata.MD
	overGRPC, err := grpcClient.Mutate(metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, "cross-2"), msg, grpcHeader(&header))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(overGRPC, fromConnect.Msg) || !interceptor.IsReplayed(header) || hs.grpcSvc.Executions() != 1 {
		t.Fatalf("over gRPC %v (%d gRPC executions), want the Connect outcome %v replayed", overGRPC, hs.grpcSvc.Executions(), fromConnect.Msg)
	}
	// And a key reused across transports with another request is refused.
	_, err = grpcClient.Mutate(metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, "cross-2"), &testingv1.MutateRequest{Payload: "other"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("reused across transports: %v, want FAILED_PRECONDITION", err)
	}
}

// A handler's own error value may be shared between calls (a package-level
// error): the gate's headers go on a copy, never on it.
func TestAHandlersSharedErrorIsNotChanged(t *testing.T) {
	shared := connect.NewError(connect.CodeUnavailable, errors.New("the provider is down"))
	h := &handler{provider: func(context.Context) error { return shared }}
	hs := setup(t, h)
	client := hs.client()
	ctx := testCtx(t)
	for range 2 {
		_, err := client.MutateKeyless(ctx, keyed("", &testingv1.MutateRequest{Payload: "keyless-shared"}))
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable {
			t.Fatalf("the call answered %v, want the handler's UNAVAILABLE", err)
		}
		if ce.Meta().Get(idemgate.KeyDerivedHeader) != "true" {
			t.Errorf("the answer lacks %s: %v", idemgate.KeyDerivedHeader, ce.Meta())
		}
	}
	if len(shared.Meta()) != 0 {
		t.Fatalf("the handler's shared error was given the gate's headers: %v", shared.Meta())
	}
}

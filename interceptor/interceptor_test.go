package interceptor_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	h := setup(t)
	const callers = 64
	req := &testingv1.MutateRequest{Payload: "charge 4200", Delay: durationpb.New(300 * time.Millisecond)}

	results := make([]result, callers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range callers {
		wg.Go(func() {
			<-start
			results[i] = h.mutate(withKey("order-8842"), req)
		})
	}
	close(start)
	wg.Wait()

	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("handler ran %d times, want exactly 1", got)
	}
	var first []byte
	succeeded := 0
	for i, r := range results {
		switch {
		case r.err == nil:
			succeeded++
			if first == nil {
				first = r.raw
			}
			if !bytes.Equal(r.raw, first) {
				t.Errorf("caller %d got response bytes %x, want %x", i, r.raw, first)
			}
		case status.Code(r.err) == codes.Aborted:
			wantStatus(t, r.err, codes.Aborted, idemgate.ReasonInFlight)
			if d, ok := grpcerr.RetryDelay(r.err); !ok || d <= 0 {
				t.Errorf("caller %d: ABORTED without a RetryInfo delay", i)
			}
		default:
			t.Errorf("caller %d got %v, want the response or ABORTED", i, r.err)
		}
	}
	if succeeded == 0 {
		t.Fatal("no caller got the response")
	}

	// Every late retry replays the very same bytes.
	again := h.mutate(withKey("order-8842"), req)
	if again.err != nil || !again.replayed || !bytes.Equal(again.raw, first) {
		t.Fatalf("retry after success: err=%v replayed=%v bytes=%x, want replayed %x", again.err, again.replayed, again.raw, first)
	}
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("handler ran %d times after the retry, want 1", got)
	}
}

func TestRetryAfterSuccessReplaysIdenticalBytes(t *testing.T) {
	t.Parallel()
	h := setup(t)
	req := &testingv1.MutateRequest{Payload: "send receipt"}

	first := h.mutate(withKey("k-1"), req)
	if first.err != nil {
		t.Fatal(first.err)
	}
	if first.replayed {
		t.Error("the first call says it was replayed")
	}
	if first.resp.GetKey() != "k-1" {
		t.Errorf("handler saw key %q in its context, want k-1", first.resp.GetKey())
	}
	for range 3 {
		again := h.mutate(withKey("k-1"), req)
		if again.err != nil {
			t.Fatal(again.err)
		}
		if !again.replayed {
			t.Error("a duplicate was not marked replayed")
		}
		if !bytes.Equal(again.raw, first.raw) {
			t.Fatalf("replay bytes %x, want %x", again.raw, first.raw)
		}
	}
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
}

func TestKeyReusedWithAnotherRequestIsRefused(t *testing.T) {
	t.Parallel()
	h := setup(t)
	if r := h.mutate(withKey("k-2"), &testingv1.MutateRequest{Payload: "amount 100"}); r.err != nil {
		t.Fatal(r.err)
	}
	r := h.mutate(withKey("k-2"), &testingv1.MutateRequest{Payload: "amount 999"})
	wantStatus(t, r.err, codes.FailedPrecondition, idemgate.ReasonKeyReused)
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
}

func TestBadKeysAreRefusedBeforeAnyDedupeCall(t *testing.T) {
	t.Parallel()
	h := setup(t)
	tests := []struct {
		name   string
		md     metadata.MD
		reason string
	}{
		{"missing", metadata.MD{}, idemgate.ReasonKeyMissing},
		{"empty", metadata.Pairs(idemgate.KeyHeader, ""), idemgate.ReasonKeyInvalid},
		{"over 255 bytes", metadata.Pairs(idemgate.KeyHeader, strings.Repeat("k", 256)), idemgate.ReasonKeyInvalid},
		{"two different values", metadata.Pairs(idemgate.KeyHeader, "a", idemgate.KeyHeader, "b"), idemgate.ReasonKeyInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := metadata.NewOutgoingContext(context.Background(), tt.md)
			_, err := h.client.Mutate(ctx, &testingv1.MutateRequest{Payload: "x"})
			wantStatus(t, err, codes.InvalidArgument, tt.reason)
		})
	}
	// Bytes a gRPC client will not even send still get a clear refusal.
	// So do keys with edge spaces, which HTTP/2 forbids and proxies may
	// trim: " order-1" must not be a second action beside "order-1".
	for _, key := range []string{"tab\there", "caf\u00e9", "nul\x00", " order-1", "order-1 ", " ", "   "} {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idemgate.KeyHeader, key))
		_, err := h.Gate.UnaryServerInterceptor()(ctx, &testingv1.MutateRequest{}, mutateInfo, func(ctx context.Context, req any) (any, error) {
			return h.svc.Mutate(ctx, req.(*testingv1.MutateRequest))
		})
		wantStatus(t, err, codes.InvalidArgument, idemgate.ReasonKeyInvalid)
	}
	// A key of exactly 255 bytes is fine.
	if r := h.mutate(withKey(strings.Repeat("k", 255)), &testingv1.MutateRequest{}); r.err != nil {
		t.Fatalf("255-byte key: %v", r.err)
	}
	if got := h.DedupeCalls.Load(); got != 2 { // Begin and Finish of the 255-byte key only
		t.Fatalf("Dedupe service got %d calls, want 2 (the refused calls must not reach it)", got)
	}
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
}

func TestSafeMethodsAreNotGated(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := context.Background()
	req := &testingv1.MutateRequest{Payload: "read"}
	for name, call := range map[string]func() error{
		"NO_SIDE_EFFECTS":              func() error { _, err := h.client.Read(ctx, req); return err },
		"IDEMPOTENT marked mutating":   func() error { _, err := h.client.Put(ctx, req); return err },
		"no policy":                    func() error { _, err := h.client.Unmarked(ctx, req); return err },
		"NO_SIDE_EFFECTS, key ignored": func() error { _, err := h.client.Read(withKey("k"), req); return err },
	} {
		if err := call(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if got := h.DedupeCalls.Load(); got != 0 {
		t.Fatalf("Dedupe service got %d calls for ungated methods, want 0", got)
	}
	if got := h.svc.Executions(); got != 4 {
		t.Fatalf("handler ran %d times, want 4", got)
	}
}

func TestDedupeServiceDownFailsClosed(t *testing.T) {
	t.Parallel()
	h := setup(t, interceptor.WithDedupeTimeout(2*time.Second))
	h.DedupeServer.Stop()

	r := h.mutate(withKey("k-3"), &testingv1.MutateRequest{Payload: "x"})
	wantStatus(t, r.err, codes.Unavailable, idemgate.ReasonStoreUnavailable)
	if _, ok := grpcerr.RetryDelay(r.err); !ok {
		t.Error("UNAVAILABLE without RetryInfo")
	}
	if got := h.svc.Executions(); got != 0 {
		t.Fatalf("handler ran %d times with the Dedupe service down, want 0", got)
	}
}

func TestHandlerErrorReleasesSoARetryRuns(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.svc.FailNext(1)
	req := &testingv1.MutateRequest{Payload: "x"}

	r := h.mutate(withKey("k-4"), req)
	if status.Code(r.err) != codes.Unavailable || status.Convert(r.err).Message() != "testsvc: downstream failed on purpose" {
		t.Fatalf("first call: %v, want the handler's own error unchanged", r.err)
	}
	if grpcerr.Reason(r.err) != "" {
		t.Errorf("the handler's error gained an ErrorInfo %q", grpcerr.Reason(r.err))
	}
	again := h.mutate(withKey("k-4"), req)
	if again.err != nil || again.replayed {
		t.Fatalf("retry: err=%v replayed=%v, want a fresh run", again.err, again.replayed)
	}
	if got := h.svc.Executions(); got != 2 {
		t.Fatalf("handler ran %d times, want 2", got)
	}
}

func TestExpiredRecordRunsAfreshAndIsSwept(t *testing.T) {
	t.Parallel()
	h := setup(t)
	req := &testingv1.MutateRequest{Payload: "x"}
	ctx := withKey("k-5")
	// MutateOther keeps outcomes for 2s.
	if _, err := h.client.MutateOther(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.MutateOther(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := h.svc.Executions(); got != 1 {
		t.Fatalf("within retention the handler ran %d times, want 1", got)
	}
	time.Sleep(2100 * time.Millisecond)
	if _, err := h.client.MutateOther(withKey("k-6"), req); err != nil { // expires too, later
		t.Fatal(err)
	}
	resp, err := h.client.MutateOther(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetExecution() != 3 || h.svc.Executions() != 3 {
		t.Fatalf("after retention: execution %d of %d, want a fresh third run", resp.GetExecution(), h.svc.Executions())
	}

	time.Sleep(2100 * time.Millisecond)
	var rows int
	if err := h.Pool.QueryRow(context.Background(), "SELECT count(*) FROM idemgate_records").Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("before sweeping: %d rows (%v), want 2", rows, err)
	}
	n, _, err := h.Store.DeleteExpired(context.Background(), 100)
	if err != nil || n != 2 {
		t.Fatalf("DeleteExpired = %d, %v; want 2 expired rows deleted", n, err)
	}
}

func TestKeysAreScopedByMethodAndTenant(t *testing.T) {
	t.Parallel()
	tenantOf := func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-tenant"); len(v) == 1 {
			return v[0], nil
		}
		return "", nil
	}
	h := setup(t, interceptor.WithTenant(tenantOf))
	req := &testingv1.MutateRequest{Payload: "same request"}

	a, err := h.client.Mutate(withKey("shared"), req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.client.MutateOther(withKey("shared"), req)
	if err != nil {
		t.Fatal(err)
	}
	c, err := h.client.Mutate(metadata.AppendToOutgoingContext(withKey("shared"), "x-tenant", "tenant-b"), req)
	if err != nil {
		t.Fatal(err)
	}
	if a.GetExecution() == b.GetExecution() || a.GetExecution() == c.GetExecution() || b.GetExecution() == c.GetExecution() {
		t.Fatalf("executions %d, %d, %d: one key on two methods and two tenants must be three records", a.GetExecution(), b.GetExecution(), c.GetExecution())
	}
	if got := h.svc.Executions(); got != 3 {
		t.Fatalf("handler ran %d times, want 3", got)
	}
}

func TestTenantFunctionErrorFailsTheCall(t *testing.T) {
	t.Parallel()
	h := setup(t, interceptor.WithTenant(func(context.Context) (string, error) {
		return "", status.Error(codes.Unauthenticated, "no credentials")
	}))
	r := h.mutate(withKey("k-7"), &testingv1.MutateRequest{})
	if status.Code(r.err) != codes.Unauthenticated {
		t.Fatalf("got %v, want the tenant function's UNAUTHENTICATED", r.err)
	}
	if h.svc.Executions() != 0 || h.DedupeCalls.Load() != 0 {
		t.Fatal("the call went on after the tenant function failed")
	}
}

func TestOutcomeOverTheLimitIsNotRunTwice(t *testing.T) {
	t.Parallel()
	h := setup(t, interceptor.WithMaxOutcomeBytes(1024))
	req := &testingv1.MutateRequest{Payload: strings.Repeat("x", 2000)}
	first := h.mutate(withKey("big"), req)
	if first.err != nil || first.resp.GetPayload() != req.GetPayload() {
		t.Fatalf("the first caller: %v, want its whole response", first.err)
	}
	r := h.mutate(withKey("big"), req)
	wantStatus(t, r.err, codes.FailedPrecondition, idemgate.ReasonResultTooLarge)
	if h.svc.Executions() != 1 || h.Gate.Stats().TooLarge != 1 {
		t.Fatalf("executions %d, too-large count %d; want 1 and 1", h.svc.Executions(), h.Gate.Stats().TooLarge)
	}
	// An outcome under the limit is unaffected.
	small := &testingv1.MutateRequest{Payload: "small"}
	h.mutate(withKey("small"), small)
	if r := h.mutate(withKey("small"), small); r.err != nil || !r.replayed {
		t.Fatalf("small outcome: %v replayed=%v", r.err, r.replayed)
	}
}

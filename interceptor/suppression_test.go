package interceptor_test

import (
	"context"
	"crypto/sha256"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// Every gated answer says how long its key is remembered, and every
// suppressed run says when the original ran and is counted by age (issue
// 14 items 8 and 11).

// headerTime parses the one RFC 3339 UTC time a header must carry.
func headerTime(t *testing.T, md metadata.MD, name string) time.Time {
	t.Helper()
	vs := md.Get(name)
	if len(vs) != 1 {
		t.Fatalf("%s = %q, want one time", name, vs)
	}
	tm, err := time.Parse(gatecore.HeaderTimeLayout, vs[0])
	if err != nil || !strings.HasSuffix(vs[0], "Z") {
		t.Fatalf("%s = %q, want an RFC 3339 UTC time with milliseconds (%v)", name, vs[0], err)
	}
	return tm
}

// inHeader is a stored time as the headers carry it: to the millisecond.
func inHeader(ts *timestamppb.Timestamp) time.Time { return ts.AsTime().Truncate(time.Millisecond) }

// storedRecord reads what the Dedupe service holds for a completed key of
// a method, through a Begin as the interceptor sends it.
func (h *harness) storedRecord(t *testing.T, fullMethod, key string, req *testingv1.MutateRequest) *idemgatev1.BeginResponse_Completed {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	fp := sha256.Sum256(b)
	res, err := h.Dedupe.Begin(context.Background(), &idemgatev1.BeginRequest{
		Scope: fullMethod, Key: key, Fingerprint: fp[:], AttemptToken: "probe-" + key,
		Lease: durationpb.New(10 * time.Second), Retention: durationpb.New(24 * time.Hour), MaxWait: durationpb.New(0),
	})
	if err != nil || res.GetCompleted() == nil {
		t.Fatalf("probe Begin = %v, %v; want completed", res, err)
	}
	return res.GetCompleted()
}

// replayAges returns the sample count of the replay age histogram per
// method label.
func replayAges(t *testing.T, reg prometheus.Gatherer) map[string]uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, f := range families {
		if f.GetName() != "idemgate_interceptor_replay_age_seconds" {
			continue
		}
		if f.GetType() != dto.MetricType_HISTOGRAM {
			t.Fatalf("idemgate_interceptor_replay_age_seconds is a %v, want a histogram", f.GetType())
		}
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != 1 || m.GetLabel()[0].GetName() != "method" {
				t.Fatalf("labels %v, want method alone", m.GetLabel())
			}
			if m.GetHistogram().GetSampleSum() < 0 {
				t.Errorf("negative replay age sum %v", m.GetHistogram().GetSampleSum())
			}
			counts[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
		}
	}
	return counts
}

func TestEveryGatedAnswerSaysWhenItsKeyExpires(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	h := setupWith(t, stacktest.Config{GateOptions: []interceptor.Option{interceptor.WithRegisterer(reg)}})
	mutate := testingv1.TestService_Mutate_FullMethodName
	retention := h.Gate.Policy(mutate).Retention
	req := &testingv1.MutateRequest{Payload: "remembered"}

	before := time.Now()
	first := h.mutate(withKey("expires-1"), req)
	after := time.Now()
	if first.err != nil {
		t.Fatal(first.err)
	}
	// First execution: the Finish's send time plus the retention, by the
	// tool server's clock; the store counts from a moment later.
	estimate := headerTime(t, first.header, idemgate.ExpiresAtHeader)
	if estimate.Before(before.Add(retention).Truncate(time.Millisecond)) || estimate.After(after.Add(retention)) {
		t.Fatalf("first answer expires at %v, want retention (%v) after the call, between %v and %v", estimate, retention, before.Add(retention), after.Add(retention))
	}
	if got := first.header.Get(idemgate.OriginalTimeHeader); len(got) != 0 {
		t.Fatalf("a first execution carries %s = %q; only suppressed runs do", idemgate.OriginalTimeHeader, got)
	}

	record := h.storedRecord(t, mutate, "expires-1", req)
	if estimate.After(record.GetExpiresAt().AsTime()) {
		t.Fatalf("the first answer promised %v, later than the record's expiry %v", estimate, record.GetExpiresAt().AsTime())
	}
	dup := h.mutate(withKey("expires-1"), req)
	if dup.err != nil || !dup.replayed {
		t.Fatalf("duplicate: %v replayed=%v", dup.err, dup.replayed)
	}
	if got := headerTime(t, dup.header, idemgate.ExpiresAtHeader); !got.Equal(inHeader(record.GetExpiresAt())) {
		t.Errorf("replay expires at %v, want the record's %v", got, record.GetExpiresAt().AsTime())
	}
	// The first answer's estimate and the replay's value of the record are
	// spelled alike (HeaderTime) and the estimate is never the later.
	if f, d := first.header.Get(idemgate.ExpiresAtHeader)[0], dup.header.Get(idemgate.ExpiresAtHeader)[0]; len(f) != len(d) || f > d {
		t.Errorf("first answer's %s %q, replay's %q: want the same format, the first no later", idemgate.ExpiresAtHeader, f, d)
	}
	if got := headerTime(t, dup.header, idemgate.OriginalTimeHeader); !got.Equal(inHeader(record.GetCompletedAt())) {
		t.Errorf("replay's original time %v, want the record's completed_at %v", got, record.GetCompletedAt().AsTime())
	}

	// A stored final error is an outcome like a response.
	failing := &testingv1.MutateRequest{Payload: "refused", FailCode: int32(codes.InvalidArgument)}
	var header metadata.MD
	_, err := h.client.MutateReplayErrors(withKey("expires-2"), failing, grpc.Header(&header))
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("first failing call: %v", err)
	}
	headerTime(t, header, idemgate.ExpiresAtHeader)
	header = nil
	_, err = h.client.MutateReplayErrors(withKey("expires-2"), failing, grpc.Header(&header))
	if status.Code(err) != codes.InvalidArgument || len(header.Get(idemgate.ReplayedHeader)) != 1 {
		t.Fatalf("replayed failing call: %v, header %v", err, header)
	}
	errRecord := h.storedRecord(t, testingv1.TestService_MutateReplayErrors_FullMethodName, "expires-2", failing)
	if got := headerTime(t, header, idemgate.OriginalTimeHeader); !got.Equal(inHeader(errRecord.GetCompletedAt())) {
		t.Errorf("replayed error's original time %v, want %v", got, errRecord.GetCompletedAt().AsTime())
	}
	headerTime(t, header, idemgate.ExpiresAtHeader)

	// A handler that sent its headers itself leaves the trailer as the
	// only place for the expiry.
	sent := &testingv1.MutateRequest{Payload: "headers sent", SendHeader: true, SetHeader: []*testingv1.MetadataPair{pair("x-a", []byte("1"))}}
	var sentHeader, sentTrailer metadata.MD
	if _, err := h.client.Mutate(withKey("expires-3"), sent, grpc.Header(&sentHeader), grpc.Trailer(&sentTrailer)); err != nil {
		t.Fatal(err)
	}
	if len(sentHeader.Get(idemgate.ExpiresAtHeader)) != 0 {
		t.Fatalf("expiry in a header the handler had already sent: %v", sentHeader)
	}
	headerTime(t, sentTrailer, idemgate.ExpiresAtHeader)

	ages := replayAges(t, reg)
	if ages[mutate] != 1 || ages[testingv1.TestService_MutateReplayErrors_FullMethodName] != 1 {
		t.Fatalf("replay age samples %v, want one per replayed method", ages)
	}
}

func TestCachedReplayCarriesTheSameHeaders(t *testing.T) {
	t.Parallel()
	h := setup(t)
	req := &testingv1.MutateRequest{Payload: "cached and visible"}
	if r := h.mutate(withKey("cached-headers"), req); r.err != nil {
		t.Fatal(r.err)
	}
	record := h.storedRecord(t, testingv1.TestService_Mutate_FullMethodName, "cached-headers", req)

	var rpcs atomic.Int64
	reg := prometheus.NewPedanticRegistry()
	conn, _ := h.SecondTool(t, h.register, stacktest.Config{DedupeClientInterceptor: countingDedupe(&rpcs),
		GateOptions: []interceptor.Option{interceptor.WithReplayCache(100, 1<<20), interceptor.WithRegisterer(reg)}})
	second := testingv1.NewTestServiceClient(conn)
	for i := range 2 { // the first asks the service and fills the cache, the second is a hit
		before := rpcs.Load()
		var header metadata.MD
		if _, err := second.Mutate(withKey("cached-headers"), req, grpc.Header(&header)); err != nil {
			t.Fatal(err)
		}
		if i == 1 && rpcs.Load() != before {
			t.Fatal("the second duplicate was not answered from the replay cache")
		}
		if got := headerTime(t, header, idemgate.OriginalTimeHeader); !got.Equal(inHeader(record.GetCompletedAt())) {
			t.Errorf("duplicate %d: original time %v, want %v", i, got, record.GetCompletedAt().AsTime())
		}
		if got := headerTime(t, header, idemgate.ExpiresAtHeader); !got.Equal(inHeader(record.GetExpiresAt())) {
			t.Errorf("duplicate %d: expires at %v, want %v", i, got, record.GetExpiresAt().AsTime())
		}
	}
	if ages := replayAges(t, reg); ages[testingv1.TestService_Mutate_FullMethodName] != 2 {
		t.Fatalf("replay age samples %v, want both replays, the cached one too", ages)
	}
}

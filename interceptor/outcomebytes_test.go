package interceptor_test

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idemgate/idemgate/dedupesvc"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
)

// finishRecorder is a Dedupe service that reserves every Begin and notes
// each Finish's declared outcome size and its real one.
type finishRecorder struct {
	idemgatev1.UnimplementedDedupeServiceServer
	mu             sync.Mutex
	declared, real []string
}

func (f *finishRecorder) Begin(context.Context, *idemgatev1.BeginRequest) (*idemgatev1.BeginResponse, error) {
	return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_Reserved_{Reserved: &idemgatev1.BeginResponse_Reserved{
		Epoch: 1, LeaseExpiresAt: timestamppb.New(time.Now().Add(time.Minute))}}}, nil
}

func (f *finishRecorder) Finish(ctx context.Context, in *idemgatev1.FinishRequest) (*idemgatev1.FinishResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.declared = append(f.declared, md.Get(dedupesvc.OutcomeBytesHeader)...)
	f.real = append(f.real, strconv.Itoa(len(in.GetOutcome().GetTypeUrl())+len(in.GetOutcome().GetValue())))
	return &idemgatev1.FinishResponse{}, nil
}

// The gate declares each Finish's outcome size (dedupesvc.OutcomeBytesHeader),
// exactly, so the Dedupe service can charge the caller's outcome bytes from
// the headers and refuse a Finish its budget cannot take before reading it.
func TestGateDeclaresTheOutcomeSizeOnFinish(t *testing.T) {
	t.Parallel()
	rec := &finishRecorder{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	idemgatev1.RegisterDedupeServiceServer(srv, rec)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(dialDedupe(t, lis.Addr().String())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gate.Close(context.Background()) })
	if _, err := gatedTool(t, gate).Mutate(withKey("k1"), &testingv1.MutateRequest{Payload: "charge"}); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.real) != 1 || len(rec.declared) != 1 || rec.declared[0] != rec.real[0] {
		t.Fatalf("Finishes declared outcome sizes %q for outcomes of %q bytes, want one Finish declaring its size", rec.declared, rec.real)
	}
}

package idemgate_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// flakyDedupe answers UNAVAILABLE to its first failures Begins, as a Dedupe
// replica does while it restarts, then reserves.
type flakyDedupe struct {
	idemgatev1.UnimplementedDedupeServiceServer
	failures int64
	calls    atomic.Int64
}

func (f *flakyDedupe) Begin(context.Context, *idemgatev1.BeginRequest) (*idemgatev1.BeginResponse, error) {
	if f.calls.Add(1) <= f.failures {
		return nil, status.Error(codes.Unavailable, "restarting")
	}
	return &idemgatev1.BeginResponse{}, nil
}

// A connection from DialDedupe carries DedupeServiceConfig: a Begin the
// service answers UNAVAILABLE twice is retried and succeeds on the third
// attempt, where a plain connection fails on the first.
func TestDialDedupeRetriesUnavailable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	flaky := &flakyDedupe{failures: 2}
	idemgatev1.RegisterDedupeServiceServer(srv, flaky)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	conn, err := idemgate.DialDedupe(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if _, err := idemgatev1.NewDedupeServiceClient(conn).Begin(ctx, &idemgatev1.BeginRequest{}); err != nil || flaky.calls.Load() != 3 {
		t.Fatalf("Begin through DialDedupe: %v after %d attempts, want success on the third", err, flaky.calls.Load())
	}

	flaky.calls.Store(0)
	plain, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })
	if _, err := idemgatev1.NewDedupeServiceClient(plain).Begin(ctx, &idemgatev1.BeginRequest{}); status.Code(err) != codes.Unavailable || flaky.calls.Load() != 1 {
		t.Fatalf("Begin through a plain connection: %v after %d attempts, want UNAVAILABLE after one (the test's control)", err, flaky.calls.Load())
	}
}

// DialDedupe without transport credentials is refused, as grpc.NewClient
// refuses it: the caller chooses TLS or plaintext, never by default.
func TestDialDedupeNeedsCredentials(t *testing.T) {
	if _, err := idemgate.DialDedupe("127.0.0.1:50051"); err == nil {
		t.Fatal("DialDedupe without credentials: no error")
	}
}

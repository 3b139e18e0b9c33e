package interceptor_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/descriptorpb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
)

// syncBuffer is a log destination the interceptor's goroutines share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A method the binary only links (payments-server links the OTLP
// exporter's TraceService/Export and never serves it) is not reported by
// New; an unclassified method that is served is logged once, at its first
// call.
func TestUnclassifiedMethodsAreLoggedWhenServedOnly(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	unclassified := method("Decide", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN, nil)
	decided := method("Get", false, descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN, &idemgatev1.MethodPolicy{Mutating: false})
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithFiles(filesWith(t, unclassified, decided)),
		interceptor.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "Decide") {
		t.Fatalf("New reported a method nothing serves yet:\n%s", logs.String())
	}
	intercept := gate.UnaryServerInterceptor()
	handler := func(context.Context, any) (any, error) { return "ok", nil }
	for range 2 {
		if _, err := intercept(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/bad.v1.BadService/Decide"}, handler); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "/bad.v1.BadService/Decide"); n != 1 {
		t.Errorf("the served unclassified method is logged %d times, want once at its first call:\n%s", n, logs.String())
	}
}

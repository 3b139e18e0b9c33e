package interceptor_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
)

var readInfo = &grpc.UnaryServerInfo{FullMethod: testingv1.TestService_Read_FullMethodName}

func noopHandler(context.Context, any) (any, error) { return nil, nil }

// An ungated method must cost a map lookup and nothing else: no Dedupe call
// (the client here is nil and would panic) and no allocation.
func TestUngatedCallDoesNotAllocate(t *testing.T) {
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithLogger(discard))
	if err != nil {
		t.Fatal(err)
	}
	intercept := gate.UnaryServerInterceptor()
	req := &testingv1.MutateRequest{}
	ctx := context.Background()
	for _, info := range []*grpc.UnaryServerInfo{readInfo, {FullMethod: testingv1.TestService_Unmarked_FullMethodName}, {FullMethod: "/not.Registered/Anywhere"}} {
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := intercept(ctx, req, info, noopHandler); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per ungated call, want 0", info.FullMethod, allocs)
		}
	}
}

// BenchmarkInterceptorUngated is the interceptor alone on an ungated method.
func BenchmarkInterceptorUngated(b *testing.B) {
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithLogger(discard))
	if err != nil {
		b.Fatal(err)
	}
	intercept := gate.UnaryServerInterceptor()
	req := &testingv1.MutateRequest{}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = intercept(ctx, req, readInfo, noopHandler)
	}
}

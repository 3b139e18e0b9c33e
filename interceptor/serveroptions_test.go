package interceptor_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// ServerOptions is the whole set-up in one call: the gate's interceptor is
// on (a charge without a key is refused), and interceptors passed to it run
// before the gate (an authentication refusal comes first, so an
// unauthenticated caller learns nothing of the gate).
func TestServerOptionsGateAfterTheCallersInterceptors(t *testing.T) {
	refuseAll := func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		return nil, status.Error(codes.Unauthenticated, "no credentials")
	}
	for _, c := range []struct {
		name   string
		extra  []grpc.ServerOption
		code   codes.Code
		reason string
	}{
		{"gate alone", nil, codes.InvalidArgument, idemgate.ReasonKeyMissing},
		{"authentication first", []grpc.ServerOption{grpc.ChainUnaryInterceptor(refuseAll)}, codes.Unauthenticated, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithLogger(discard))
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer(gate.ServerOptions(c.extra...)...)
			paymentsv1.RegisterPaymentsServiceServer(srv, paymentsv1.UnimplementedPaymentsServiceServer{})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = srv.Serve(lis) }()
			defer srv.Stop()
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err = paymentsv1.NewPaymentsServiceClient(conn).ChargeCard(ctx, &paymentsv1.ChargeCardRequest{CustomerId: "cust_1", AmountCents: 100})
			if status.Code(err) != c.code || grpcerr.Reason(err) != c.reason {
				t.Fatalf("a charge without a key: %v (reason %q), want %s with reason %q", err, grpcerr.Reason(err), c.code, c.reason)
			}
		})
	}
}

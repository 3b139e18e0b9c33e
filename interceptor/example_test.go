package interceptor_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
)

// A tool server gates the methods its .proto marks mutating.
func ExampleNew() {
	conn, err := grpc.NewClient("127.0.0.1:50051",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn))
	if err != nil {
		log.Fatal(err) // a misconfigured policy, named
	}
	srv := grpc.NewServer(gate.ServerOptions()...) // the codec (a replay's bytes are the first answer's) and the interceptors
	defer srv.Stop()

	fmt.Println(gate.Policy(paymentsv1.PaymentsService_ChargeCard_FullMethodName))
	fmt.Println(gate.Policy(paymentsv1.PaymentsService_GetBalance_FullMethodName))
	// Output:
	// gated(action=/examples.payments.v1.PaymentsService/ChargeCard, retention=24h0m0s, lease=10s, on_lost_outcome=fail_closed, replay_codes=[], unknown_codes=[], max_wait=3s, keyless=reject, execution_timeout=1m0s, finish=before_reply)
	// ungated
}

// After registering its services, a tool server checks that each method it
// serves had a decision made about it: gated, or declared safe.
func ExampleGate_CheckServer() {
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil))
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
	paymentsv1.RegisterPaymentsServiceServer(srv, paymentsv1.UnimplementedPaymentsServiceServer{})
	healthpb.RegisterHealthServer(srv, health.NewServer()) // gRPC's own services are exempt
	if err := gate.CheckServer(srv); err != nil {
		log.Fatal(err) // names each unclassified method
	}
	fmt.Println("every served method is classified")
	// Output: every served method is classified
}

// The policy surface as read from proto/idemgate/testing/v1/testing.proto:
// a lost-outcome policy, replayed error codes, and a keyless window.
func ExampleGate_Policy() {
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(gate.Policy(testingv1.TestService_MutateReexecute_FullMethodName))
	fmt.Println(gate.Policy(testingv1.TestService_MutateReplayErrors_FullMethodName))
	fmt.Println(gate.Policy(testingv1.TestService_MutateKeyless_FullMethodName))
	// Output:
	// gated(action=/idemgate.testing.v1.TestService/MutateReexecute, retention=24h0m0s, lease=1s, on_lost_outcome=reexecute, replay_codes=[], unknown_codes=[], max_wait=0s, keyless=reject, execution_timeout=1m0s, finish=before_reply)
	// gated(action=/idemgate.testing.v1.TestService/MutateReplayErrors, retention=24h0m0s, lease=10s, on_lost_outcome=fail_closed, replay_codes=[INVALID_ARGUMENT FAILED_PRECONDITION], unknown_codes=[], max_wait=3s, keyless=reject, execution_timeout=1m0s, finish=before_reply)
	// gated(action=/idemgate.testing.v1.TestService/MutateKeyless, retention=24h0m0s, lease=1s, on_lost_outcome=fail_closed, replay_codes=[], unknown_codes=[], max_wait=3s, keyless=fingerprint(2s), execution_timeout=1m0s, finish=before_reply)
}

// The orchestration layer mints one key per logical action and reuses it
// for every retry of that action.
func ExampleWithKey() {
	caller, err := interceptor.NewCaller()
	if err != nil {
		log.Fatal(err)
	}
	conn, err := grpc.NewClient("127.0.0.1:50052",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// The caller first, then the retry interceptor: every attempt
		// reuses the key.
		grpc.WithChainUnaryInterceptor(caller.UnaryClientInterceptor(),
			retry.UnaryClientInterceptor(retry.WithMax(4), retry.WithCodes(codes.Unavailable, codes.Aborted))))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	payments := paymentsv1.NewPaymentsServiceClient(conn)

	orderID := "order-8842"
	ctx := interceptor.WithKey(context.Background(), orderID+"-charge")
	var replayed bool
	resp, err := payments.ChargeCard(ctx, &paymentsv1.ChargeCardRequest{CustomerId: "cust_17", AmountCents: 4200},
		interceptor.Replayed(&replayed))
	if err != nil {
		log.Print(err)
		return
	}
	fmt.Println(resp.GetChargeId(), "replayed:", replayed)
}

// With WithMintedKeys a call that names no key gets a time-ordered one,
// made once per logical call and kept across the retries below it.
func ExampleWithMintedKeys() {
	caller, err := interceptor.NewCaller(interceptor.WithMintedKeys())
	if err != nil {
		log.Fatal(err)
	}
	conn, err := grpc.NewClient("127.0.0.1:50052",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(caller.UnaryClientInterceptor()),
		// grpc-go's own retries run below every interceptor: they reuse it too.
		grpc.WithDefaultServiceConfig(`{"methodConfig": [{"name": [{"service": "examples.payments.v1.PaymentsService"}],
		  "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
		                  "retryableStatusCodes": ["UNAVAILABLE"]}}]}`))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
}

// A request can carry its key in a field marked
// (idemgate.v1.field) = {idempotency_key: true}, as AIP-155's request_id.
// KeyFromContext returns it as the caller sent it, for logs and for looking
// the action up; it is not unique across tenants and methods.
func ExampleKeyFromContext() {
	handler := func(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
		key, _ := idemgate.KeyFromContext(ctx)
		return &testingv1.MutateResponse{Key: key}, nil
	}
	_ = handler
	_ = &testingv1.MutateRequest{Payload: "charge", RequestId: "order-8842-charge"}
}

// A handler hands the payment provider the downstream key: the same for
// every attempt at the action, different for another tenant or method that
// uses the same key. It passes its context on and returns the provider's
// error, as every handler should: a timeout there leaves the outcome unknown,
// and the interceptor never frees the key for it.
func ExampleDownstreamKeyFromContext() {
	type provider interface {
		Charge(ctx context.Context, idempotencyKey string, cents int64) (chargeID string, err error)
	}
	handler := func(p provider) func(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
		return func(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
			key, _ := idemgate.DownstreamKeyFromContext(ctx)
			id, err := p.Charge(ctx, key, 1299)
			if err != nil {
				return nil, err
			}
			return &testingv1.MutateResponse{Payload: id}, nil
		}
	}
	_ = handler
}

// A downstream store that supports conditional writes takes the fencing
// token, so an attempt that lost its reservation cannot overwrite the work of
// the one that took over; the handler's context is cancelled with ErrFenced
// as soon as the interceptor learns of it.
func ExampleFencingTokenFromContext() {
	handler := func(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
		token, _ := idemgate.FencingTokenFromContext(ctx)
		// UPDATE ledger SET ..., epoch = $epoch WHERE id = $id AND epoch <= $epoch
		_ = token.Epoch
		if errors.Is(context.Cause(ctx), idemgate.ErrFenced) {
			return nil, idemgate.OutcomeUnknownError(context.Cause(ctx))
		}
		return &testingv1.MutateResponse{}, nil
	}
	_ = handler
}

// A handler whose provider client failed after sending the request cannot
// tell whether the charge happened; it says so, and the key is never freed
// for a second charge.
func ExampleOutcomeUnknownError() {
	err := idemgate.OutcomeUnknownError(status.Error(codes.Unavailable, "connection reset after the request was sent"))
	fmt.Println(status.Code(err))
	// Output: Unavailable
}

// A handler decides per error whether it is the action's final outcome.
func ExampleFinalError() {
	charge := func(declined bool) error {
		if declined {
			// The provider decided: replay this to every retry, never charge again.
			return idemgate.FinalError(status.Error(codes.FailedPrecondition, "card declined"))
		}
		// The provider was unreachable: nothing happened, a retry may run.
		return idemgate.RetryableError(status.Error(codes.Unavailable, "provider unreachable"))
	}
	fmt.Println(status.Code(charge(true)), status.Code(charge(false)))
	// Output: FailedPrecondition Unavailable
}

// A reconciler settles a lost outcome by asking the system that knows.
func ExampleWithReconciler() {
	lookup := func(ctx context.Context, key string) (chargeID string, found bool, err error) { return "", false, nil }
	reconcile := func(ctx context.Context, key string, req proto.Message) (idemgate.Resolution, error) {
		id, found, err := lookup(ctx, key)
		switch {
		case err != nil:
			return idemgate.StillUnknown(), err
		case found:
			charge := req.(*paymentsv1.ChargeCardRequest)
			return idemgate.ResolvedResponse(&paymentsv1.ChargeCardResponse{
				ChargeId: id, CustomerId: charge.GetCustomerId(), AmountCents: charge.GetAmountCents(),
			}), nil
		default:
			return idemgate.ResolvedNotRun(), nil
		}
	}
	_, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil),
		interceptor.WithReconciler(paymentsv1.PaymentsService_ChargeCard_FullMethodName, reconcile),
		interceptor.WithFinishRetryBudget(30*time.Second))
	fmt.Println(err)
	// Output: <nil>
}

// Tenants namespace keys: plug in your own authentication.
func ExampleWithTenant() {
	tenantOf := func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-verified-tenant"); len(v) == 1 { // set by your auth interceptor, never by the caller
			return v[0], nil
		}
		return "", status.Error(codes.Unauthenticated, "no tenant")
	}
	_, err := interceptor.New(idemgatev1.NewDedupeServiceClient(nil), interceptor.WithTenant(tenantOf))
	fmt.Println(err)
	// Output: <nil>
}

// IsReplayed reads the response header a replay carries.
func ExampleIsReplayed() {
	fmt.Println(interceptor.IsReplayed(metadata.Pairs(idemgate.ReplayedHeader, "true")))
	// Output: true
}

// Response metadata the handler sets is stored with the outcome: every
// duplicate gets the same header and trailer as the first caller, next to
// idempotency-replayed.
func ExampleGate_UnaryServerInterceptor_responseMetadata() {
	chargeCard := func(ctx context.Context, req *paymentsv1.ChargeCardRequest) (*paymentsv1.ChargeCardResponse, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-provider-request-id", "req_93"))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-ledger-entry", "entry-7"))
		return &paymentsv1.ChargeCardResponse{ChargeId: "ch_1", CustomerId: req.GetCustomerId(), AmountCents: req.GetAmountCents()}, nil
	}
	_ = chargeCard

	// On the client, a retry reads the first call's metadata.
	var header, trailer metadata.MD
	_ = []grpc.CallOption{grpc.Header(&header), grpc.Trailer(&trailer)}
}

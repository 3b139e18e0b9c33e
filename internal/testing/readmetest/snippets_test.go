package readmetest

// Each function holds README snippets verbatim, between README:begin and
// README:end, with what a snippet assumes (a context, credentials, a
// handler) as its parameters, so `go vet` and `go test` compile every
// snippet; TestREADMESnippetsCompile checks the README shows these texts.

import (
	"context"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/connectgate"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/gen/examples/payments/v1/paymentsv1connect"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/httpgate"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/mcpgate"
)

// snippets are referenced here so that nothing reports them unused: they
// are compiled, never run.
var snippets = []any{replicas, grpcServer, httpServer, connectServer, grpcCaller, mcpServer, mcpHTTP, mcpClient, resolve, reconciler}

func replicas(creds credentials.TransportCredentials) error {
	// README:begin
	conn, err := idemgate.DialDedupe("dns:///dedupe.internal:50051", grpc.WithTransportCredentials(creds))
	// README:end
	if err != nil {
		return err
	}
	return conn.Close()
}

func grpcServer(ctx context.Context, creds credentials.TransportCredentials, tenantFromAuth interceptor.TenantFunc,
	authInterceptor grpc.UnaryServerInterceptor, impl paymentsv1.PaymentsServiceServer, lis net.Listener, logger *slog.Logger) error {
	// README:begin
	// With idemgate.DedupeServiceConfig: Begin/Finish/Release retried on
	// UNAVAILABLE (safe, each is idempotent), round robin over the replicas.
	conn, err := idemgate.DialDedupe("dedupe.internal:50051",
		grpc.WithTransportCredentials(creds),
		// Finds a connection left half-open by a crashed host or a partition.
		// Time no shorter than the service's -keepalive-min-time (10s).
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: 15 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}))
	if err != nil {
		return err
	}
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn),
		interceptor.WithDedupeConn(conn),       // logs name its address; WatchDedupe follows it
		interceptor.WithTenant(tenantFromAuth)) // optional; default: one tenant
	if err != nil {
		return err // a policy misconfiguration, reported at start-up
	}
	srv := grpc.NewServer(gate.ServerOptions( // the gate's codec, these, then the gate's interceptors
		grpc.ChainUnaryInterceptor(
			recovery.UnaryServerInterceptor(), // outermost: the gate re-panics a handler's panic
			authInterceptor,                   // so the tenant function can trust the identity
		))...)
	paymentsv1.RegisterPaymentsServiceServer(srv, impl)
	if err := gate.CheckServer(srv); err != nil {
		return err // a served method nobody classified
	}
	if err := gate.CheckDedupe(ctx); err != nil { // log it; the Dedupe service may come up later
		logger.Warn("the Dedupe service does not serve this tool server yet", "error", err)
	}
	healthSrv := health.NewServer()
	healthpb.RegisterHealthServer(srv, healthSrv)
	go gate.WatchDedupe(ctx, healthSrv) // "idemgate.dedupe": SERVING while gated calls can run
	go srv.Serve(lis)
	<-ctx.Done() // until it is time to stop
	srv.GracefulStop()
	gate.Close(context.Background()) // waits for outcomes still being stored in the background
	// README:end
	return nil
}

func httpServer(ctx context.Context, conn *grpc.ClientConn, mux *http.ServeMux, addr string) error {
	// README:begin
	gate, err := httpgate.New(idemgatev1.NewDedupeServiceClient(conn), "payments-api",
		httpgate.WithDedupeConn(conn),
		httpgate.WithRoute("POST /charges", httpgate.RoutePolicy{ReplayClientErrors: true}),
		httpgate.WithRoute("POST /webhooks/", httpgate.RoutePolicy{NotGated: true}))
	if err != nil {
		return err
	}
	defer gate.Close(ctx)
	// Timeouts, and connection caps in total and per client address: the defaults.
	limits := httpgate.ServerLimits{}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return limits.Server(gate.Handler(mux)).Serve(limits.Listener(lis))
	// README:end
}

func connectServer(dedupeConn *grpc.ClientConn, mux *http.ServeMux, svc paymentsv1connect.PaymentsServiceHandler) error {
	// README:begin
	gate, err := connectgate.New(idemgatev1.NewDedupeServiceClient(dedupeConn), connectgate.WithDedupeConn(dedupeConn))
	if err != nil {
		return err
	}
	// The gate's interceptor and its limits, which hold before a request is decoded.
	path, handler := paymentsv1connect.NewPaymentsServiceHandler(svc, gate.HandlerOptions()...)
	mux.Handle(path, gate.HTTPMiddleware(handler))
	// README:end
	return nil
}

type action struct{ ID string }

func grpcCaller(ctx context.Context, toolAddr string, creds grpc.DialOption, action action, req *paymentsv1.ChargeCardRequest) error {
	// README:begin
	caller, err := interceptor.NewCaller() // reads which methods are gated from the same descriptors
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(toolAddr, creds,
		grpc.WithChainUnaryInterceptor(
			caller.UnaryClientInterceptor(),                // FIRST: attaches the key once per logical call
			retry.UnaryClientInterceptor(retry.WithMax(4)), // THEN go-grpc-middleware's retry
		))
	if err != nil {
		return err
	}
	payments := paymentsv1.NewPaymentsServiceClient(conn)

	ctx = interceptor.WithKey(ctx, "order/"+action.ID+"/charge") // once per action, reused by every retry
	var replayed bool
	resp, err := payments.ChargeCard(ctx, req, interceptor.Replayed(&replayed))
	// README:end
	_ = resp
	return err
}

type (
	chargeIn   struct{ CustomerID string }
	chargeOut  struct{ ChargeID string }
	balanceIn  struct{ CustomerID string }
	balanceOut struct{ Charges int64 }
)

func mcpServer(ctx context.Context, creds grpc.DialOption, schema any,
	chargeCard mcp.ToolHandlerFor[chargeIn, chargeOut], getBalance mcp.ToolHandlerFor[balanceIn, balanceOut]) error {
	yes := true
	// README:begin
	server := mcp.NewServer(&mcp.Implementation{Name: "payments-mcp", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "charge_card", InputSchema: schema,
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes}}, chargeCard) // not read-only, not idempotent: gated
	mcp.AddTool(server, &mcp.Tool{Name: "get_balance",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, getBalance) // read-only: never gated

	conn, err := idemgate.DialDedupe("127.0.0.1:50051", creds) // with idemgate.DedupeServiceConfig
	if err != nil {
		return err
	}
	gate, err := mcpgate.New(ctx, idemgatev1.NewDedupeServiceClient(conn), server, // after the tools are added
		mcpgate.WithDedupeConn(conn), // reconnect at once after a Dedupe service restart
		mcpgate.WithStrict())         // optional: every tool classified
	if err != nil {
		return err // a tool nobody classified (strict), or a contradictory policy
	}
	defer gate.Close(ctx) // waits for outcomes still being stored

	// stdio: the key reader lets SEP-3182's idempotencyKey parameter through the SDK
	return server.Run(ctx, &mcp.IOTransport{Reader: mcpgate.KeyReader(os.Stdin), Writer: os.Stdout})
	// README:end
}

func mcpHTTP(server *mcp.Server) {
	// README:begin
	http.Handle("/mcp", mcpgate.HTTPHandler(server)) // stateless; SEP-3182's parameter let through
	// README:end
}

func mcpClient(ctx context.Context, session *mcp.ClientSession, orderID string) error {
	// README:begin
	res, err := session.CallTool(ctx, &mcp.CallToolParams{
		Name:      "charge_card",
		Arguments: map[string]any{"customerId": "cust_17", "amountCents": 4200},
		Meta:      mcp.Meta{mcpgate.MetaKey: "order/" + orderID + "/charge"}, // "io.idemgate/idempotency-key": the action's key
	})
	if err != nil {
		return err
	}
	replayed := res.Meta[mcpgate.MetaReplayed] == true // "io.idemgate/replayed"
	// README:end
	_ = replayed
	return nil
}

func resolve(ctx context.Context, dedupe idemgatev1.DedupeServiceClient) error {
	// README:begin
	found, err := anypb.New(&paymentsv1.ChargeCardResponse{ChargeId: "ch_000042", CustomerId: "cust_17", AmountCents: 4200})
	if err != nil {
		return err
	}
	_, err = dedupe.Resolve(ctx, &idemgatev1.ResolveRequest{
		Scope:      "/examples.payments.v1.PaymentsService/ChargeCard", // full method, then "|tenant" if any
		Key:        "order-8842",
		Resolution: &idemgatev1.ResolveRequest_Complete{Complete: found}, // or ResolveRequest_Release_
	})
	// README:end
	return err
}

// charge and chargeProvider are the payment provider the reconciler snippet
// asks.
type charge struct{ ID string }

type chargeProvider interface {
	FindChargeByIdempotencyKey(ctx context.Context, key string) (charge, bool, error)
}

func reconciler(dedupe idemgatev1.DedupeServiceClient, provider chargeProvider) {
	// README:begin
	gate, err := interceptor.New(dedupe, interceptor.WithReconciler(
		paymentsv1.PaymentsService_ChargeCard_FullMethodName,
		func(ctx context.Context, key string, req proto.Message) (idemgate.Resolution, error) {
			charge, found, err := provider.FindChargeByIdempotencyKey(ctx, key)
			switch {
			case err != nil:
				return idemgate.StillUnknown(), err
			case found:
				return idemgate.ResolvedResponse(&paymentsv1.ChargeCardResponse{ChargeId: charge.ID /* ... */}), nil
			default:
				return idemgate.ResolvedNotRun(), nil // the next step runs the handler
			}
		}))
	// README:end
	if err != nil {
		log.Fatal(err)
	}
	_ = gate
}

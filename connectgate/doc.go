// Package connectgate gates mutating Connect procedures with idempotency
// keys, as package interceptor gates gRPC methods: a retried call replays
// the first outcome instead of running its side effect again. It serves the
// Connect, gRPC and gRPC-Web protocols alike, through connect-go's handlers.
//
// Methods are marked in their .proto files, as for the interceptor:
//
//	rpc ChargeCard(ChargeCardRequest) returns (ChargeCardResponse) {
//	  option (idemgate.v1.policy) = {mutating: true};
//	}
//
// then build a Gate on a client of the Dedupe service, build the generated
// handler with its HandlerOptions and wrap it in its HTTPMiddleware:
//
//	gate, err := connectgate.New(idemgatev1.NewDedupeServiceClient(conn))
//	path, h := paymentsv1connect.NewPaymentsServiceHandler(svc, gate.HandlerOptions()...)
//	mux.Handle(path, gate.HTTPMiddleware(h))
//
// HandlerOptions holds the gate's interceptor and its limits; Interceptor
// alone carries none, because connect-go reads, inflates and decodes a
// request before any interceptor sees it. A request message over
// WithMaxRequestBytes (4 MiB, grpc-go's default), as sent or as inflated, is
// refused while it is read, before it is decoded, with
// CodeResourceExhausted and ReasonRequestTooLarge: the key is not reserved
// and the handler does not run. A response over WithMaxResponseBytes (4
// MiB) is not sent (connect.WithSendMaxBytes).
//
// Everything but the carrier is the interceptor's (internal/protogate and
// internal/gatecore): the policies read from the same descriptors, the key
// from the Idempotency-Key header or the request's key field, the
// fingerprint, the scope (the policy's action, or the procedure
// "/pkg.Service/Method", which is the gRPC full method name, then "|" and
// the tenant), what a handler error means (idemgate.FinalError and the
// other marks work here), reconcilers (idemgate.Reconciler), the replay
// cache, the error reasons, and the response headers (idempotency-replayed,
// idempotency-original-time, idempotency-expires-at,
// idempotency-key-derived). So a key used over gRPC against the
// interceptor and over Connect against this gate, on one Dedupe service and
// with one tenant, names one action: whichever comes second replays the
// first's outcome. The handler's context carries the call as under the
// interceptor: idemgate.KeyFromContext, DownstreamKeyFromContext and
// FencingTokenFromContext read it.
//
// Every refusal is a *connect.Error with the code the interceptor would
// answer and its google.rpc.ErrorInfo (and RetryInfo where a retry helps)
// as error details. A handler's own error is read through its *connect.Error
// (code, message, details, metadata), or as a gRPC status error.
//
// A replay answers with a *connect.Response whose Any() is a proto.Message
// wrapping the method's response: its generated type when the binary links
// it in (protoregistry.GlobalTypes, as the interceptor replays), so the
// replay's bytes are the first answer's, else a dynamicpb message of its
// descriptor. connect-go's handler only sends response.Any() (a
// proto.Message, which the codecs encode by reflection) with the response's
// headers and trailers, so no generated Go type is needed to answer; an
// interceptor outside the gate that type-asserts a generated response type
// sees the wrapper on replays (read it through proto.Message instead).
// HandlerOptions' codecs encode deterministically (map fields in key order,
// JSON compacted), so a first answer and its replays carry the same bytes.
// A dynamicpb message is encoded in a fixed order too, but one that may put
// a oneof's fields after the generated type's: a replay of a type the binary
// lacks is the same message, not always the same bytes.
//
// Streaming procedures pass through ungated; a streaming method marked
// mutating makes New fail, as it makes interceptor.New fail.
package connectgate

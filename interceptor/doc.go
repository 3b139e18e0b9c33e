// Package interceptor gates mutating gRPC methods with idempotency keys, so a
// retried call replays the first outcome instead of running its side effect
// again.
//
// Mark a method in its .proto file:
//
//	rpc ChargeCard(ChargeCardRequest) returns (ChargeCardResponse) {
//	  option (idemgate.v1.policy) = {mutating: true};
//	}
//
// then build a Gate on a client of the Dedupe service and register its
// interceptor on the tool server:
//
//	conn, _ := grpc.NewClient(dedupeAddr, grpc.WithTransportCredentials(...),
//		grpc.WithDefaultServiceConfig(interceptor.DedupeServiceConfig))
//	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn))
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
//
// For a gated call the interceptor reads the key from the "idempotency-key"
// metadata, reserves it with the Dedupe service (Begin), runs the handler
// once, and stores its response (Finish). A duplicate gets the stored
// response, with the response header "idempotency-replayed: true"; a
// duplicate that arrives while the first call runs gets ABORTED; a call
// without a key is refused. Every refusal is a status error with one
// google.rpc.ErrorInfo whose reason is one of the Reason constants.
//
// Methods without the policy, and methods whose idempotency_level is
// NO_SIDE_EFFECTS or IDEMPOTENT, are not gated: they cost a map lookup, no
// Dedupe call and no allocation.
//
// Only unary methods can be gated: a streaming method marked mutating makes
// New fail, because its outcome is not one message to store and replay.
package interceptor

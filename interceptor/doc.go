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
//		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
//	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn))
//	srv := grpc.NewServer(gate.ServerOptions()...) // the codec and the interceptors
//
// For a gated call the interceptor reads the key from the "idempotency-key"
// metadata, reserves it with the Dedupe service (Begin), runs the handler
// once, and stores its response (Finish). A duplicate gets the stored
// response, with the response header "idempotency-replayed: true"; a
// duplicate that arrives while the first call runs gets ABORTED; a call
// without a key is refused. Every answer that carries the action's outcome
// says until when it is replayed (ExpiresAtHeader), and every replay when
// the outcome was stored (OriginalTimeHeader); with WithRegisterer each
// replay's age is observed in idemgate_interceptor_replay_age_seconds.
//
// By default the outcome is stored before the caller is answered. A method
// whose policy says finish: FINISH_POLICY_AFTER_REPLY is answered first and
// its outcome stored right after, in the background (duplicates meanwhile
// wait for it, and Close waits for it too); an outcome that then never
// lands was answered "ok" anyway, and goes down on_lost_outcome like any
// lost outcome. Every refusal is a status error with one
// google.rpc.ErrorInfo whose reason is one of package idemgate's Reason
// constants.
//
// The names every gate shares (metadata names, reasons, context accessors,
// error marks, reconcilers, Policy) live in package idemgate; this
// package's names of them are deprecated aliases.
//
// A duplicate also gets the response metadata the handler set: what it
// passed to grpc.SetHeader, grpc.SendHeader and grpc.SetTrailer is stored
// with the outcome and set again on every replay, byte for byte, with a
// final error as with a response, also when the caller gave up before the
// handler set it (the handler is told of no refusal then). Keys the
// transport owns (":" and "grpc-" prefixes, content-type, te, user-agent)
// are not kept. An outcome without
// such metadata is stored as before, and records stored before metadata was
// kept replay unchanged. Because the handler's context carries a recording
// stream, grpc.SetSendCompressor and grpc.ClientSupportedCompressors are
// unavailable in gated handlers.
//
// Methods without the policy, and methods whose idempotency_level is
// NO_SIDE_EFFECTS or IDEMPOTENT, are not gated: they cost a map lookup, no
// Dedupe call and no allocation.
//
// The handler runs on a context that keeps the caller's values but not its
// cancellation or deadline (the method's execution_timeout bounds it
// instead), so a caller that gives up after the side effect started never
// causes a second run: the outcome is stored and its retry replays it. The
// context ends early with idemgate.ErrFenced when the attempt loses its
// reservation. idemgate.DownstreamKeyFromContext is the key to hand a
// downstream provider, and idemgate.FencingTokenFromContext the token for a
// conditional write.
//
// From Begin until the outcome is stored or released, the reservation's
// lease is renewed; if the tool server dies mid-call, the method's
// on_lost_outcome decides what the next call finds (FAIL_CLOSED by default:
// IDEMPOTENCY_OUTCOME_UNKNOWN until the record is resolved, or a Reconciler
// settles it). A handler error is final (replay_codes, idemgate.FinalError:
// stored and replayed), leaves the outcome unknown (context errors,
// DEADLINE_EXCEEDED, CANCELLED, unknown_codes, idemgate.OutcomeUnknownError:
// never frees a FAIL_CLOSED key), or otherwise releases the key so a retry
// runs again.
//
// On the client side, NewCaller's UnaryClientInterceptor attaches the key
// from WithKey (or mints one) to gated calls; chain it before any retrying
// interceptor. The key may also travel in a request field marked
// (idemgate.v1.field) = {idempotency_key: true}.
//
// When the Dedupe service cannot be reached or refuses the tool server,
// gated calls fail closed, and the Gate says why: it logs each failing
// Dedupe RPC (rate-limited: WithDedupeFailureLogInterval) with the service's
// address (WithDedupeConn), the code and the message; CheckDedupe is a
// start-up check that changes nothing; and WatchDedupe keeps the tool
// server's health status for DedupeHealthService ("idemgate.dedupe") in
// step with the service.
//
// Only unary methods can be gated: a streaming method marked mutating makes
// New fail, because its outcome is not one message to store and replay; the
// stream interceptors pass every stream through.
package interceptor

// Package dedupesvc is the Dedupe gRPC service: it reserves idempotency keys,
// stores the outcome of the attempt that ran, and answers duplicates with that
// outcome. It is shared infrastructure that every gated tool server calls
// through the interceptor package.
//
// A replay never writes at Begin: with [WithReplayRecorder] the service counts
// replays per record in memory and adds them to the store in one statement
// per flush ([ReplayRecorder], [ReplayCounter]), so an operator sees every
// suppressed execution; [AdminServer] also lets an operator forget a key
// ([Forgetter]).
//
// The service is a thin, validating layer over a [Store]; the PostgreSQL
// implementation lives in dedupesvc/pgstore. Run it with cmd/dedupesvc; run
// it inside a tool server, with dedupesvc's store, migrations, sweeper and
// defaults, with dedupesvc/embedded; or assemble it yourself:
//
//	store := pgstore.New(pool)
//	srv := grpc.NewServer()
//	idemgatev1.RegisterDedupeServiceServer(srv, dedupesvc.NewServer(store))
//	go dedupesvc.NewSweeper(store, dedupesvc.SweeperConfig{}).Run(ctx)
package dedupesvc

package interceptor

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/protogate"
	"github.com/idemgate/idemgate/internal/replayfields"
)

// Gate holds the resolved policies of every method and a client of the
// Dedupe service. It is safe for concurrent use.
type Gate struct {
	// dedupe is the client of the Dedupe service, observed (dedupeconn.go):
	// the engine's, and CheckDedupe's and WatchDedupe's.
	dedupe *gatecore.Observer
	// engine reserves, keeps the lease, settles and counts: the
	// transport-free core the MCP middleware (mcpgate) runs on too.
	engine  *gatecore.Engine
	methods map[string]*gatedMethod
	// unclassified and services are what CheckServer compares a server with.
	unclassified []string
	// unclassifiedOnce logs each unclassified method at its first call.
	unclassifiedOnce map[string]*sync.Once
	services         map[string]bool
	opts             options
	metrics          *metrics
	// codec is what the Gate knows of the server's codec (ServerCodec).
	codec codecCheck
}

// New resolves the policy of every method in the descriptor registry (see
// WithFiles) and returns a Gate that deduplicates the gated ones through
// dedupe. It fails, naming each method, when a policy is inconsistent: a
// method marked both mutating and NO_SIDE_EFFECTS, a streaming method marked
// mutating, a lease, retention or max_wait out of range, an unknown replay
// code, or a reconciler for a method that is not gated.
func New(dedupe idemgatev1.DedupeServiceClient, opts ...Option) (*Gate, error) {
	if dedupe == nil {
		return nil, fmt.Errorf("idemgate: New needs a Dedupe service client, got nil")
	}
	o := defaultOptions
	for _, opt := range opts {
		opt(&o)
	}
	o.perCaller = replayfields.New(o.perCallerNames...)
	r, err := resolvePolicies(o.files, o.types, o.reconcilers)
	if err != nil {
		return nil, err
	}
	metrics, err := newMetrics(o.registerer)
	if err != nil {
		return nil, err
	}
	if len(r.unclassified) > 0 {
		if refused := strictRefusals(r.unclassified, o); len(refused) > 0 {
			return nil, fmt.Errorf("idemgate: strict mode: %d methods are neither marked mutating nor declared safe with idempotency_level "+
				"(NO_SIDE_EFFECTS or IDEMPOTENT); classify each: %s", len(refused), strings.Join(refused, ", "))
		}
	}
	// Not logged here: the descriptors hold every service the binary links
	// (an OpenTelemetry exporter's TraceService among them), most of which
	// it never serves. A served one is named by CheckServer, or logged at
	// its first call (noteUnclassified).
	unclassifiedOnce := make(map[string]*sync.Once, len(r.unclassified))
	for _, m := range r.unclassified {
		unclassifiedOnce[m] = new(sync.Once)
	}
	observed := gatecore.NewObserver(dedupe, o.dedupeConn, o.logger, o.dedupeLogEvery) // logs failing Dedupe RPCs, for health too
	engine := gatecore.New(observed, gatecore.Options{
		ReplayCache: gatecore.NewReplayCache(o.replayEntries, o.replayBytes, o.replayTTL),
		Logger:      o.logger, DedupeTimeout: o.dedupeTimeout, OutcomeTimeout: o.outcomeTimeout, FinishBudget: o.finishBudget,
		InFlightRetry: o.inFlightRetry, StoreRetry: o.storeRetry, MaxOutcome: o.maxOutcome, TypeURLOf: resultTypeURL,
		OnEvent: metrics.event, OnStage: metrics.stage,
	})
	return &Gate{dedupe: observed, engine: engine, methods: r.gated, unclassified: r.unclassified, unclassifiedOnce: unclassifiedOnce,
		services: r.services, opts: o, metrics: metrics}, nil
}

// ServiceInfoProvider lists the services registered on a gRPC server;
// *grpc.Server implements it.
type ServiceInfoProvider interface {
	GetServiceInfo() map[string]grpc.ServiceInfo
}

// CheckServer holds the services registered on srv to strict mode's rule,
// whatever else the binary links: it returns one error naming every method of
// those services that is neither marked mutating nor declared safe with
// idempotency_level, and every service the Gate's descriptors (WithFiles)
// do not describe, whose methods it could never gate. gRPC's own grpc.*
// services (health, reflection) are exempt. Call it after registering your
// services and before Serve; a nil error means every served method had a
// decision made about it.
func (g *Gate) CheckServer(srv ServiceInfoProvider) error {
	served := srv.GetServiceInfo()
	var problems []string
	for service := range served {
		if strings.HasPrefix(service, "grpc.") {
			continue
		}
		if !g.services[service] {
			problems = append(problems, fmt.Sprintf("service %s is registered but not in the Gate's descriptors (WithFiles), so none of its methods can be gated", service))
		}
	}
	for _, m := range g.unclassified {
		service, _, _ := strings.Cut(strings.TrimPrefix(m, "/"), "/")
		if _, ok := served[service]; ok {
			problems = append(problems, m+" is neither marked mutating nor declared safe with idempotency_level (NO_SIDE_EFFECTS or IDEMPOTENT)")
		}
	}
	if len(problems) == 0 {
		return nil
	}
	sort.Strings(problems)
	return fmt.Errorf("idemgate: this server serves methods no policy decides: %s", strings.Join(problems, "; "))
}

// strictRefusals returns the unclassified methods strict mode refuses.
func strictRefusals(unclassified []string, o options) []string {
	if !o.strict {
		return nil
	}
	if len(o.strictServices) == 0 {
		return unclassified
	}
	var refused []string
	for _, m := range unclassified {
		service, _, _ := strings.Cut(strings.TrimPrefix(m, "/"), "/")
		if slices.Contains(o.strictServices, service) {
			refused = append(refused, m)
		}
	}
	return refused
}

// Close waits until every outcome and release still being retried in the
// background, and every FINISH_POLICY_AFTER_REPLY outcome not yet stored,
// is settled or given up. When ctx ends first it stops those
// retries (each is logged and counted as given up: its record runs down its
// lease to its on_lost_outcome path), waits for them to return, and returns
// ctx's error. Call it after the gRPC server stopped.
func (g *Gate) Close(ctx context.Context) error { return g.engine.Close(ctx) }

// Policy returns the resolved policy of a full method name
// ("/pkg.Service/Method"); a method it does not gate reports Gated false.
func (g *Gate) Policy(fullMethod string) idemgate.Policy {
	if m, ok := g.methods[fullMethod]; ok {
		return m.policy
	}
	return idemgate.Policy{}
}

// UnaryServerInterceptor returns the server interceptor that gates unary
// calls. Put it after authentication (the tenant function may read the
// caller's identity) and after any panic recovery (a panicking handler is a
// lost outcome, and the interceptor re-panics), before anything that retries
// the handler.
func (g *Gate) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		m, ok := g.methods[info.FullMethod]
		if !ok {
			g.noteUnclassified(info.FullMethod)
			return handler(ctx, req)
		}
		g.checkCodec(info.FullMethod, m)
		var outcome string
		resp, err := g.gate(ctx, req, info.FullMethod, m, handler, &outcome)
		g.countCall(info.FullMethod, outcome, err)
		return resp, err
	}
}

// noteUnclassified logs, at its first call, a served method no policy
// decides: it runs ungated.
func (g *Gate) noteUnclassified(fullMethod string) {
	if once, ok := g.unclassifiedOnce[fullMethod]; ok {
		once.Do(func() {
			g.opts.logger.Info("idemgate: this method is neither marked mutating nor declared safe with idempotency_level, so it is not gated; "+
				"classify it, or use WithStrict (and CheckServer) to refuse such methods", slog.String("method", fullMethod))
		})
	}
}

// StreamServerInterceptor returns the stream interceptor. It passes every
// stream through untouched: a streaming method marked mutating makes New
// fail, because a stream's outcome is not one message to store and replay,
// so no stream is ever gated. Register it to make that guarantee explicit
// next to the unary one.
func (g *Gate) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, ss)
	}
}

// call is one gated call: its identity in the Dedupe service (the core's
// Call), the method it calls, and what the core needs of gRPC to run it
// (gatecore.Transport).
type call struct {
	*gatecore.Call
	g *Gate
	// fullMethod is the gRPC method name, the metrics' method label.
	fullMethod string
	method     *gatedMethod
	// ctx is the caller's stream context, where the response metadata goes.
	ctx     context.Context
	req     any
	handler grpc.UnaryHandler
}

// gate runs one gated call; it sets *outcome to "executed" when the handler
// ran and "replayed" when a stored outcome answered, and leaves it empty when
// the call was refused (the error's reason says why).
func (g *Gate) gate(ctx context.Context, req any, fullMethod string, m *gatedMethod, handler grpc.UnaryHandler, outcome *string) (any, error) {
	arrived := time.Now()
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idemgate: request of %s is %T, not a protobuf message", fullMethod, req)
	}
	key, err := m.keyOf(ctx, msg)
	if err != nil {
		return nil, err
	}
	tenant, err := g.opts.tenant(ctx)
	if err != nil {
		return nil, err
	}
	fingerprint, err := m.fingerprint(msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemgate: fingerprint the request of %s: %v", fullMethod, err)
	}
	retention := m.policy.Retention
	if key == "" {
		// KEYLESS_POLICY_FINGERPRINT: the request names the action, for the
		// window only.
		key = derivedKeyPrefix + hex.EncodeToString(fingerprint)
		retention = m.policy.KeylessWindow
		if err := grpc.SetHeader(ctx, metadata.Pairs(idemgate.KeyDerivedHeader, "true")); err != nil {
			g.metadataRefused(ctx, "idemgate: could not set the derived-key header", slog.Any("error", err))
		}
	}
	c := &call{g: g, fullMethod: fullMethod, method: m, ctx: ctx, req: req, handler: handler,
		Call: gatecore.NewCall(fullMethod, scopeOf(m.policy.Action, tenant), key, fingerprint, gatecore.Policy{
			Lease: m.policy.Lease, MaxWait: m.policy.MaxWait, OnLostOutcome: m.policy.OnLostOutcome, ExecutionTimeout: m.policy.ExecutionTimeout,
			FinishAfterReply: m.policy.FinishAfterReply,
		}, retention)}
	c.Agent = tenant
	if m.Reconcile != nil {
		c.Reconcile = func(ctx context.Context) (gatecore.Resolution, error) { return c.reconcile(ctx, msg) }
	}
	resp, result, err := g.engine.Gate(ctx, c.Call, c, arrived)
	*outcome = string(result)
	return resp, err
}

// Replay implements gatecore.Transport: the stored outcome, as the method's
// response or the final error it ended with.
func (c *call) Replay(ctx context.Context, s gatecore.Stored) (any, error, bool) {
	c.g.suppressed(ctx, c, s)
	return c.g.replay(ctx, c.method, s.Outcome)
}

// Committed implements gatecore.Transport: the caller learns until when the
// outcome is replayed.
func (c *call) Committed(ctx context.Context, expiresAt time.Time) {
	c.g.setHeaders(ctx, idemgate.ExpiresAtHeader, headerTimeText(expiresAt))
}

// Run implements gatecore.Transport: the handler, on the attempt's context
// (which carries the call's identity) with a recorder of the response
// metadata it sets,
// and what its answer means (classify).
func (c *call) Run(hctx context.Context, _ *gatecore.Attempt) gatecore.Ran {
	handlerCtx, recorded := recordMetadata(hctx, c.ctx, c.g.replayable)
	resp, handlerErr := c.handler(handlerCtx, c.req)
	if handlerErr != nil {
		verdict, st, unwrapped := c.method.classify(handlerErr)
		switch verdict {
		case gatecore.VerdictNotRun:
			return gatecore.Ran{Verdict: verdict, Answer: resp, Err: unwrapped}
		case gatecore.VerdictUnknown:
			return gatecore.Ran{Verdict: verdict, Answer: resp, Err: unwrapped, Code: grpcerr.CodeName(st.Code()), Message: st.Message()}
		}
		outcome, err := recorded.wrap(gatecore.MarshalAny(st.Proto()))
		if err != nil {
			c.g.opts.logger.ErrorContext(c.ctx, "idemgate: could not serialize a final error to store it; releasing instead", slog.String("scope", c.Scope), slog.Any("error", err))
			return gatecore.Ran{Verdict: gatecore.VerdictNotRun, Answer: resp, Err: unwrapped}
		}
		// The caller gets exactly what duplicates will be replayed.
		return gatecore.Ran{Verdict: gatecore.VerdictOutcome, Outcome: outcome, Err: status.FromProto(st.Proto()).Err()}
	}
	respMsg, ok := resp.(proto.Message)
	if !ok {
		return gatecore.Ran{Verdict: gatecore.VerdictAbandoned, Answer: resp} // grpc will fail to encode it anyway
	}
	outcome, err := recorded.wrap(gatecore.MarshalAny(respMsg))
	if err != nil {
		return gatecore.Ran{Verdict: gatecore.VerdictLost, Answer: resp, Why: "could not serialize the response to store it", Attrs: []slog.Attr{slog.Any("error", err)}}
	}
	return gatecore.Ran{Verdict: gatecore.VerdictOutcome, Outcome: outcome, Answer: resp}
}

// suppressed makes an answer from a stored outcome, a run that did not
// happen, visible: its caller learns when the outcome was stored and until
// when it is replayed, and its age is observed per method. It is called for
// every such answer, from the Dedupe service or the replay cache, whatever
// the stored outcome turns out to be.
func (g *Gate) suppressed(ctx context.Context, c *call, stored gatecore.Stored) {
	var pairs []string
	if !stored.CompletedAt.IsZero() {
		pairs = append(pairs, idemgate.OriginalTimeHeader, headerTimeText(stored.CompletedAt))
		if g.metrics != nil {
			// A clock behind the service's must not observe a negative age.
			g.metrics.replayAge.WithLabelValues(c.fullMethod).Observe(max(time.Since(stored.CompletedAt), 0).Seconds())
		}
	}
	if !stored.ExpiresAt.IsZero() {
		pairs = append(pairs, idemgate.ExpiresAtHeader, headerTimeText(stored.ExpiresAt))
	}
	g.setHeaders(ctx, pairs...)
}

// headerTimeText spells a time as the interceptor's time headers carry it.
func headerTimeText(t time.Time) string {
	return gatecore.HeaderTime(t)
}

// setHeaders sets the interceptor's own response headers, or trailers when
// the handler already sent the headers: the caller must get them either
// way, and a trailer is the only place left. A caller that gave up gets
// neither, which is logged at debug level only (metadataRefused): nothing
// is sent twice, the stream is finished.
func (g *Gate) setHeaders(ctx context.Context, pairs ...string) {
	if len(pairs) == 0 {
		return
	}
	md := metadata.Pairs(pairs...)
	if grpc.SetHeader(ctx, md) == nil {
		return
	}
	if err := grpc.SetTrailer(ctx, md); err != nil {
		g.metadataRefused(ctx, "idemgate: could not set the interceptor's response metadata", slog.Any("keys", pairs), slog.Any("error", err))
	}
}

// reconcile asks the method's Reconciler what happened to a lost outcome,
// as the core stores it (protogate).
func (c *call) reconcile(ctx context.Context, req proto.Message) (gatecore.Resolution, error) {
	return c.method.Reconciled(ctx, c.fullMethod, c.Key, req, status.Convert)
}

// replay returns the stored outcome: the method's response, or the final
// error it ended with, with the response metadata the handler set, and
// whether it replayed one. A stored type that is neither is an error, never
// a reason to run again.
func (g *Gate) replay(ctx context.Context, m *gatedMethod, outcome *anypb.Any) (any, error, bool) {
	r, err := m.Decode(outcome)
	if err != nil {
		return nil, err, false
	}
	g.markReplayed(ctx)
	g.replayMetadata(ctx, replayedMetadata{header: metadata.MD(r.Header), trailer: metadata.MD(r.Trailer)})
	if r.Err != nil {
		return nil, r.Err, true
	}
	return r.Response, nil, true
}

func (g *Gate) markReplayed(ctx context.Context) {
	if err := grpc.SetHeader(ctx, metadata.Pairs(idemgate.ReplayedHeader, "true")); err != nil {
		g.metadataRefused(ctx, "idemgate: could not set the replayed header", slog.Any("error", err))
	}
}

// derivedKeyPrefix starts every key derived from a keyless call's
// fingerprint, so it never collides with a caller's key of the same text.
const derivedKeyPrefix = protogate.DerivedKeyPrefix

// keyOf returns the call's idempotency key from the metadata or the request's
// key field, "" for a keyless call the policy deduplicates on its
// fingerprint, or the status error to refuse the call with.
func (m *gatedMethod) keyOf(ctx context.Context, req proto.Message) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	return m.Key("the "+idemgate.KeyHeader+" metadata", md.Get(idemgate.KeyHeader), req)
}

// scopeOf joins the method and the tenant (protogate.Scope).
func scopeOf(fullMethod, tenant string) string { return protogate.Scope(fullMethod, tenant) }

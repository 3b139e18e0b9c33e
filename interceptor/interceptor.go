package interceptor

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/keys"
)

// Metadata names the interceptor reads and writes.
const (
	// KeyHeader is the request metadata that carries the idempotency key.
	KeyHeader = "idempotency-key"
	// ReplayedHeader is the response header set to "true" when the response
	// is a stored outcome replayed instead of a fresh execution.
	ReplayedHeader = "idempotency-replayed"
	// KeyDerivedHeader is the response header set to "true" when a keyless
	// call was deduplicated on its fingerprint (KEYLESS_POLICY_FINGERPRINT).
	KeyDerivedHeader = "idempotency-key-derived"
	// ExpiresAtHeader is the response header, an RFC 3339 UTC time, until
	// which the outcome is replayed to duplicates: on a replay the record's
	// expires_at as the Dedupe service holds it; on a first execution the
	// time this process sent its outcome to be stored (or, under
	// FINISH_POLICY_AFTER_REPLY, answered) plus the method's retention, by
	// this process's clock. The service counts the retention from when it
	// stored the outcome, a moment later, so the record lives at least that
	// long once stored. A trailer instead when the handler already sent the
	// response headers.
	ExpiresAtHeader = "idempotency-expires-at"
	// OriginalTimeHeader is the response header, an RFC 3339 UTC time, that
	// every answer from a stored outcome carries (a replay, from the Dedupe
	// service or the replay cache): when that outcome was stored, the
	// record's completed_at (from a replay cache entry this process filled
	// with its own Finish: when it sent that Finish).
	OriginalTimeHeader = "idempotency-original-time"
)

// DedupeServiceConfig is a gRPC service config for the client connection to
// the Dedupe service: it retries every Dedupe RPC on UNAVAILABLE with
// backoff, which is safe because each of them is idempotent. Pass it with
// grpc.WithDefaultServiceConfig.
const DedupeServiceConfig = `{
  "methodConfig": [{
    "name": [{"service": "idemgate.v1.DedupeService"}],
    "retryPolicy": {
      "maxAttempts": 4,
      "initialBackoff": "0.05s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

// Gate holds the resolved policies of every method and a client of the
// Dedupe service. It is safe for concurrent use.
type Gate struct {
	dedupe  idemgatev1.DedupeServiceClient
	methods map[string]*gatedMethod
	// unclassified and services are what CheckServer compares a server with.
	unclassified []string
	services     map[string]bool
	opts         options
	counts       counters
	metrics      *metrics
	// background tracks Finish and Release retries still running after
	// their caller got its response, and re-sent Begins whose first answer
	// was lost.
	background sync.WaitGroup
	// stopBackground ends the background work, when Close's context ends
	// first; backgroundCtx is what that work runs under.
	backgroundCtx  context.Context
	stopBackground context.CancelFunc
	// lostBegins bounds how many lost Begins are followed up at once, so an
	// outage does not pile up a goroutine per refused call.
	lostBegins chan struct{}
	// replays is the replay cache (WithReplayCache), nil when off.
	replays *replayCache
}

// maxLostBeginFollowUps bounds the lost Begins followed up at once; past it
// a lost Begin is logged and counted, and its reservation, if it was made,
// runs down its lease.
const maxLostBeginFollowUps = 1024

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
		o.logger.Info("idemgate: these methods are neither marked mutating nor declared safe with idempotency_level, so they are not gated; "+
			"classify them, or use WithStrict to refuse such methods", slog.Any("methods", r.unclassified))
	}
	backgroundCtx, stopBackground := context.WithCancel(context.Background())
	return &Gate{dedupe: dedupe, methods: r.gated, unclassified: r.unclassified, services: r.services, opts: o, metrics: metrics,
		backgroundCtx: backgroundCtx, stopBackground: stopBackground, lostBegins: make(chan struct{}, maxLostBeginFollowUps),
		replays: newReplayCache(o.replayEntries, o.replayBytes, o.replayTTL)}, nil
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
func (g *Gate) Close(ctx context.Context) error {
	done := make(chan struct{})
	go func() { g.background.Wait(); close(done) }()
	select {
	case <-done:
		g.stopBackground()
		return nil
	case <-ctx.Done():
		g.stopBackground()
		<-done
		return ctx.Err()
	}
}

// Policy returns the resolved policy of a full method name
// ("/pkg.Service/Method"); a method it does not gate reports Gated false.
func (g *Gate) Policy(fullMethod string) Policy {
	if m, ok := g.methods[fullMethod]; ok {
		return m.policy
	}
	return Policy{}
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
			return handler(ctx, req)
		}
		var outcome string
		resp, err := g.gate(ctx, req, info.FullMethod, m, handler, &outcome)
		g.countCall(info.FullMethod, outcome, err)
		return resp, err
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

// call is one gated call's identity in the Dedupe service.
type call struct {
	// fullMethod is the gRPC method name, the metrics' method label.
	fullMethod string
	method     *gatedMethod
	key        string
	scope      string
	token      string
	// begin is the call's Begin request.
	begin *idemgatev1.BeginRequest
	// retention is how long the record is kept once completed.
	retention time.Duration
}

// maxReconcileRounds bounds Begin after a reconciler settled a record: the
// next Begin normally replays or reserves, unless another caller raced.
const maxReconcileRounds = 3

// gate runs one gated call; it sets *outcome to "executed" when the handler
// ran and "replayed" when a stored outcome answered, and leaves it empty when
// the call was refused (the error's reason says why).
func (g *Gate) gate(ctx context.Context, req any, fullMethod string, m *gatedMethod, handler grpc.UnaryHandler, outcome *string) (any, error) {
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
		if err := grpc.SetHeader(ctx, metadata.Pairs(KeyDerivedHeader, "true")); err != nil {
			g.opts.logger.WarnContext(ctx, "idemgate: could not set the derived-key header", slog.Any("error", err))
		}
	}
	c := call{fullMethod: fullMethod, method: m, key: key, scope: scopeOf(m.policy.Action, tenant), token: rand.Text()}
	c.begin = &idemgatev1.BeginRequest{
		Scope:         c.scope,
		Key:           key,
		Fingerprint:   fingerprint,
		AttemptToken:  c.token,
		Lease:         durationpb.New(m.policy.Lease),
		Retention:     durationpb.New(retention),
		OnLostOutcome: m.policy.OnLostOutcome,
		MaxWait:       durationpb.New(m.policy.MaxWait),
	}
	c.retention = retention
	if g.replays != nil {
		if stored, ok := g.replays.get(c.scope, key, fingerprint); ok {
			g.event(c, eventReplayCacheHit)
			g.suppressed(ctx, c, stored)
			resp, err, replayed := g.replay(ctx, m, stored.outcome)
			if replayed {
				*outcome = outcomeReplayed
			}
			return resp, err
		}
		g.event(c, eventReplayCacheMiss)
	}

	for round := 0; ; round++ {
		beginCtx, cancel := context.WithTimeout(ctx, g.opts.dedupeTimeout+m.policy.MaxWait)
		sent := time.Now()
		begun, err := g.dedupe.Begin(beginCtx, c.begin)
		cancel()
		if err != nil {
			if !refused(err) {
				// The reservation may have been made and only its answer
				// lost: make sure it does not outlive this call.
				g.followUpLostBegin(ctx, c)
			}
			return nil, g.beginError(ctx, err)
		}

		switch result := begun.GetResult().(type) {
		case *idemgatev1.BeginResponse_Reserved_:
			*outcome = outcomeExecuted
			return g.run(ctx, req, c, result.Reserved.GetEpoch(), time.Since(sent), handler)
		case *idemgatev1.BeginResponse_Completed_:
			stored := cachedOutcome{outcome: result.Completed.GetOutcome(),
				completedAt: timeOf(result.Completed.GetCompletedAt()), expiresAt: timeOf(result.Completed.GetExpiresAt())}
			g.suppressed(ctx, c, stored)
			resp, err, replayed := g.replay(ctx, m, stored.outcome)
			if replayed {
				*outcome = outcomeReplayed // a response, or a stored final error
				if g.replays != nil {
					g.replays.put(c.scope, key, fingerprint, stored)
				}
			}
			return resp, err
		case *idemgatev1.BeginResponse_InFlight_:
			return nil, grpcerr.New(codes.Aborted, ReasonInFlight,
				"another call with this idempotency key is still running; retry with the same key to get its outcome",
				nil, g.opts.inFlightRetry)
		case *idemgatev1.BeginResponse_FingerprintMismatch_:
			return nil, grpcerr.New(codes.FailedPrecondition, ReasonKeyReused,
				"this idempotency key was first used with a different request; use a new key for a new action",
				nil, 0)
		case *idemgatev1.BeginResponse_OutcomeUnknown_:
			if m.reconcile == nil || round >= maxReconcileRounds {
				return nil, outcomeUnknown(key)
			}
			resp, settled, err := g.reconcile(ctx, c, msg)
			if err != nil || settled {
				return resp, err
			}
			// Released, or another caller settled it first: Begin again.
		default:
			return nil, grpcerr.New(codes.Internal, ReasonStoreRejected,
				fmt.Sprintf("the Dedupe service answered Begin with an unknown result %T", result), nil, 0)
		}
	}
}

// timeOf is ts as a time, or the zero time when the Dedupe service sent
// none.
func timeOf(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

// suppressed makes an answer from a stored outcome, a run that did not
// happen, visible: its caller learns when the outcome was stored and until
// when it is replayed, and its age is observed per method. It is called for
// every such answer, from the Dedupe service or the replay cache, whatever
// the stored outcome turns out to be.
func (g *Gate) suppressed(ctx context.Context, c call, stored cachedOutcome) {
	var pairs []string
	if !stored.completedAt.IsZero() {
		pairs = append(pairs, OriginalTimeHeader, headerTimeText(stored.completedAt))
		if g.metrics != nil {
			// A clock behind the service's must not observe a negative age.
			g.metrics.replayAge.WithLabelValues(c.fullMethod).Observe(max(time.Since(stored.completedAt), 0).Seconds())
		}
	}
	if !stored.expiresAt.IsZero() {
		pairs = append(pairs, ExpiresAtHeader, headerTimeText(stored.expiresAt))
	}
	g.setHeaders(ctx, pairs...)
}

// headerTimeText spells a time as the interceptor's time headers carry it.
func headerTimeText(t time.Time) string {
	return t.UTC().Format(time.RFC3339Nano)
}

// setHeaders sets the interceptor's own response headers, or trailers when
// the handler already sent the headers: the caller must get them either
// way, and a trailer is the only place left.
func (g *Gate) setHeaders(ctx context.Context, pairs ...string) {
	if len(pairs) == 0 {
		return
	}
	md := metadata.Pairs(pairs...)
	if grpc.SetHeader(ctx, md) == nil {
		return
	}
	if err := grpc.SetTrailer(ctx, md); err != nil {
		g.opts.logger.WarnContext(ctx, "idemgate: could not set the interceptor's response metadata", slog.Any("keys", pairs), slog.Any("error", err))
	}
}

func outcomeUnknown(key string) error {
	return grpcerr.New(codes.FailedPrecondition, ReasonOutcomeUnknown,
		"an earlier attempt with this idempotency key stopped before its outcome was stored, so its side effect may or may not have happened; "+
			"it will not run again until an operator resolves the record (idemctl, or the Dedupe service's Resolve)",
		map[string]string{"key": key}, 0)
}

// reconcile asks the method's Reconciler what happened to a lost outcome and
// settles the record with its answer. It reports settled with the call's
// answer, or not settled when the caller should Begin again.
func (g *Gate) reconcile(ctx context.Context, c call, req proto.Message) (any, bool, error) {
	res, err := c.method.reconcile(ctx, c.key, req)
	if err != nil {
		g.opts.logger.WarnContext(ctx, "idemgate: the reconciler failed; the outcome stays unknown", slog.String("scope", c.scope), slog.Any("error", err))
		return nil, true, outcomeUnknown(c.key)
	}
	resolve := &idemgatev1.ResolveRequest{Scope: c.scope, Key: c.key}
	switch res.kind {
	case resolvedResponse:
		if res.response == nil || res.response.ProtoReflect().Descriptor().FullName() != c.method.outputName {
			return nil, true, status.Errorf(codes.Internal, "idemgate: the reconciler of %s answered %T, not a %s", c.scope, res.response, c.method.outputName)
		}
		outcome, err := marshalAny(res.response)
		if err != nil {
			return nil, true, status.Errorf(codes.Internal, "idemgate: serialize the reconciler's response: %v", err)
		}
		resolve.Resolution = &idemgatev1.ResolveRequest_Complete{Complete: outcome}
	case resolvedError:
		outcome, err := marshalAny(status.Convert(res.err).Proto())
		if err != nil {
			return nil, true, status.Errorf(codes.Internal, "idemgate: serialize the reconciler's error: %v", err)
		}
		resolve.Resolution = &idemgatev1.ResolveRequest_Complete{Complete: outcome}
	case resolvedNotRun:
		resolve.Resolution = &idemgatev1.ResolveRequest_Release_{Release: &idemgatev1.ResolveRequest_Release{}}
	default:
		return nil, true, outcomeUnknown(c.key)
	}
	resolveCtx, cancel := context.WithTimeout(ctx, g.opts.dedupeTimeout)
	defer cancel()
	if _, err := g.dedupe.Resolve(resolveCtx, resolve); err != nil {
		if code := status.Code(err); code != codes.FailedPrecondition && code != codes.NotFound {
			return nil, true, g.beginError(ctx, err)
		}
	}
	// Settled by us, or by a racing caller, or expired meanwhile: either way
	// the next Begin replays the settled outcome or reserves a free key.
	g.event(c, eventReconciled)
	return nil, false, nil
}

// run executes the handler under the reservation and records what happened.
// The handler runs on a context that keeps the caller's values but not its
// cancellation or deadline, bounded by the method's execution_timeout: a
// caller that gave up after the side effect started must find its outcome
// stored when it retries, not a second run. The lease is renewed from here
// until the outcome is stored or released, with no gap in between.
//
// beginTook is how long Begin took to answer: a reservation made early in a
// slow or retried Begin has used that much of its lease already, so the
// first renewal comes that much sooner.
func (g *Gate) run(ctx context.Context, req any, c call, epoch int64, beginTook time.Duration, handler grpc.UnaryHandler) (resp any, err error) {
	hctx, cancelExecution := context.WithTimeoutCause(context.WithoutCancel(ctx), c.method.policy.ExecutionTimeout, ErrExecutionTimeout)
	defer cancelExecution()
	hctx, fence := context.WithCancelCause(hctx)
	defer fence(nil)
	lease := g.keepLease(ctx, c, epoch, c.method.policy.Lease/3-beginTook, func() { fence(ErrFenced) })
	defer func() {
		if p := recover(); p != nil {
			lease.stop()
			g.event(c, eventOutcomeLost)
			g.opts.logger.ErrorContext(ctx, "idemgate: the handler panicked; its outcome is lost, not released, so the key will not silently run again",
				slog.String("scope", c.scope), slog.Int64("epoch", epoch), slog.Any("panic", p))
			panic(p)
		}
	}()
	handlerCtx, recorded := recordMetadata(contextWithCall(hctx, c, epoch))
	resp, handlerErr := handler(handlerCtx, req)

	if handlerErr != nil {
		kind, st, unwrapped := c.method.classify(handlerErr)
		switch kind {
		case errRetryable:
			g.release(ctx, c, epoch, false, lease)
			return resp, unwrapped
		case errUnknown:
			if c.method.policy.OnLostOutcome == idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_REEXECUTE {
				g.release(ctx, c, epoch, false, lease)
				return resp, unwrapped
			}
			g.release(ctx, c, epoch, true, lease)
			return nil, handlerOutcomeUnknown(c.key, st)
		}
		outcome, err := recorded.wrap(marshalAny(st.Proto()))
		if err != nil {
			g.opts.logger.ErrorContext(ctx, "idemgate: could not serialize a final error to store it; releasing instead", slog.String("scope", c.scope), slog.Any("error", err))
			g.release(ctx, c, epoch, false, lease)
			return resp, unwrapped
		}
		if fenced := g.storeOutcome(ctx, hctx, c, epoch, outcome, lease); fenced {
			return g.answerFenced()
		}
		// The caller gets exactly what duplicates will be replayed.
		return nil, status.FromProto(st.Proto()).Err()
	}

	respMsg, ok := resp.(proto.Message)
	if !ok {
		lease.stop()
		return resp, nil // grpc will fail to encode it anyway
	}
	outcome, err := recorded.wrap(marshalAny(respMsg))
	if err != nil {
		lease.stop()
		g.opts.logger.ErrorContext(ctx, "idemgate: could not serialize the response to store it", slog.String("scope", c.scope), slog.Any("error", err))
		g.event(c, eventOutcomeLost)
		return resp, nil
	}
	if fenced := g.storeOutcome(ctx, hctx, c, epoch, outcome, lease); fenced {
		return g.answerFenced()
	}
	return resp, nil
}

// storeOutcome stores the outcome of a handler that ran, before its caller
// is answered or, under FINISH_POLICY_AFTER_REPLY, right after, and tells
// the caller until when the outcome will be replayed. It reports whether the
// attempt was fenced, so the caller must not get this attempt's answer.
//
// hctx is the handler's context: an attempt already fenced while the handler
// ran stores synchronously even under FINISH_POLICY_AFTER_REPLY, so its
// caller is told, as under the default, instead of getting an answer no
// duplicate will see.
func (g *Gate) storeOutcome(ctx, hctx context.Context, c call, epoch int64, outcome *anypb.Any, lease *leaseKeeper) (fenced bool) {
	// The service counts the retention from when it stores the outcome,
	// after this, so the record lives at least until expires once stored.
	expires := time.Now().Add(c.retention)
	afterReply := c.method.policy.FinishAfterReply && !errors.Is(context.Cause(hctx), ErrFenced)
	if fenced := g.finish(ctx, c, epoch, outcome, lease, afterReply); fenced {
		return true
	}
	g.setHeaders(ctx, ExpiresAtHeader, headerTimeText(expires))
	return false
}

// answerFenced answers the caller of a holder whose outcome the store
// refused because another attempt took the key over (REEXECUTE) or an
// operator settled it. This attempt's response is not the action's outcome,
// so the caller gets IDEMPOTENCY_IN_FLIGHT: its retry with the same key gets
// the outcome the store holds, as every duplicate does. (Looking it up here
// would take a Begin, which under REEXECUTE may itself take the key over.)
func (g *Gate) answerFenced() (any, error) {
	return nil, grpcerr.New(codes.Aborted, ReasonInFlight,
		"this attempt lost its reservation to another attempt before its outcome was stored, so its response is not the action's outcome; "+
			"retry with the same key to get the outcome that was stored",
		nil, g.opts.inFlightRetry)
}

// handlerOutcomeUnknown is what the caller of a FAIL_CLOSED handler that
// could not tell whether its side effect happened gets: the same answer its
// retries will get.
func handlerOutcomeUnknown(key string, st *status.Status) error {
	return grpcerr.New(codes.FailedPrecondition, ReasonOutcomeUnknown,
		fmt.Sprintf("the handler ended with %s (%s), which leaves its side effect's outcome unknown; the record is marked outcome-unknown "+
			"and the call will not run again until an operator resolves it (idemctl, or the Dedupe service's Resolve)", codeName(st.Code()), st.Message()),
		map[string]string{"key": key}, 0)
}

// leaseKeeper renews one reservation until stop is called.
type leaseKeeper struct {
	cancel context.CancelFunc
	done   chan struct{}
	// settling is set once the outcome is on its way: a renewal refused from
	// then on is the settlement racing it, and the settlement's own answer
	// says whether the attempt was fenced.
	settling atomic.Bool
}

// stop ends the renewals and waits for them; it may be called more than once.
func (k *leaseKeeper) stop() {
	k.cancel()
	<-k.done
}

// maxOutstandingRenewals bounds the renewals in flight at once: a renewal
// that hangs must not stop the next one from being sent, and a dead store
// must not collect an unbounded number of them.
const maxOutstandingRenewals = 4

// keepLease renews the reservation about every third of the lease, the
// first time after first (at once when that is not positive), until
// stopped. When a renewal fails, or hangs past the next tick, another one is
// sent every tenth of the lease without waiting for it, so neither a flaky
// store nor a hung connection costs a live holder its reservation while
// some renewal can still get through. A renewal the service refuses means
// the attempt was fenced: fenced is called and the renewals stop.
func (g *Gate) keepLease(ctx context.Context, c call, epoch int64, first time.Duration, fenced func()) *leaseKeeper {
	lease := c.method.policy.Lease
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	k := &leaseKeeper{cancel: cancel, done: make(chan struct{})}
	req := &idemgatev1.HeartbeatRequest{Scope: c.scope, Key: c.key, AttemptToken: c.token, Epoch: epoch, Lease: durationpb.New(lease)}
	go func() {
		defer close(k.done)
		var attempts sync.WaitGroup
		defer attempts.Wait()
		results := make(chan error, maxOutstandingRenewals)
		outstanding := 0
		timer := time.NewTimer(max(first, 0))
		defer timer.Stop()
		for {
			select {
			case <-kctx.Done():
				return
			case <-timer.C:
				if outstanding < maxOutstandingRenewals {
					outstanding++
					attempts.Add(1)
					go func() {
						defer attempts.Done()
						callCtx, cancelCall := context.WithTimeout(kctx, lease/2)
						defer cancelCall()
						_, err := g.dedupe.Heartbeat(callCtx, req)
						results <- err
					}()
				}
				// Until a renewal gets through, keep sending one a tick.
				timer.Reset(lease / 10)
			case err := <-results:
				outstanding--
				switch {
				case err == nil:
					timer.Reset(lease / 3)
				case kctx.Err() != nil:
					return
				case status.Code(err) == codes.FailedPrecondition && k.settling.Load():
					return
				case status.Code(err) == codes.FailedPrecondition:
					g.event(c, eventFenced)
					g.opts.logger.WarnContext(ctx, "idemgate: the reservation was taken over or settled by another attempt (its lease ran out, or an operator resolved it); "+
						"the handler's context is cancelled with ErrFenced and this attempt's outcome will be refused",
						slog.String("scope", c.scope), slog.Int64("epoch", epoch))
					fenced()
					return
				default:
					g.event(c, eventHeartbeatFailure)
					g.opts.logger.WarnContext(ctx, "idemgate: could not renew the reservation's lease; trying again soon", slog.String("scope", c.scope), slog.Int64("epoch", epoch), slog.Any("error", err))
				}
			}
		}
	}()
	return k
}

// release gives the reservation up after a handler error, so a retry runs;
// with unknown set it marks the record outcome-unknown instead, because the
// handler cannot tell whether its side effect happened.
func (g *Gate) release(ctx context.Context, c call, epoch int64, unknown bool, lease *leaseKeeper) {
	req := &idemgatev1.ReleaseRequest{Scope: c.scope, Key: c.key, AttemptToken: c.token, Epoch: epoch, OutcomeUnknown: unknown}
	lost := "the handler failed, but its reservation could not be released"
	if unknown {
		lost = "the handler's outcome is unknown, but the record could not be marked so"
		// A renewal that lands after the mark would turn the record back
		// into a live reservation: no renewal may be under way when it goes.
		lease.stop()
	}
	_ = g.settle(ctx, c, epoch, lease, settlement{
		rpc: "Release",
		call: func(ctx context.Context) error {
			_, err := g.dedupe.Release(ctx, req)
			return err
		},
		retryEvent: eventReleaseRetry,
		failEvent:  eventReleaseFailure,
		lost:       lost,
	}, false)
}

// reasonDedupeOutcomeUnreadable is the Dedupe service's ErrorInfo reason
// for a stored outcome sealed with a key it no longer has
// (dedupesvc.ReasonOutcomeUnreadable).
const reasonDedupeOutcomeUnreadable = "DEDUPE_OUTCOME_UNREADABLE"

// reasonDedupeOutcomeTooLarge is the Dedupe service's ErrorInfo reason for
// an outcome over its own size limit (dedupesvc.ReasonOutcomeTooLarge).
const reasonDedupeOutcomeTooLarge = "DEDUPE_OUTCOME_TOO_LARGE"

// finish stores the outcome of a handler that ran. An outcome over the
// Dedupe service's limit, when that is below the Gate's, is replaced by the
// same ResultTooLarge marker the Gate's own limit stores, so a duplicate
// never runs the side effect again for want of a stored outcome.
//
// It reports whether the store refused the outcome at once because the
// attempt had been fenced, so the caller must not get this attempt's
// response.
//
// With afterReply it returns at once and stores the outcome in the
// background (settle), reporting false.
func (g *Gate) finish(ctx context.Context, c call, epoch int64, outcome *anypb.Any, lease *leaseKeeper, afterReply bool) (fenced bool) {
	req := &idemgatev1.FinishRequest{Scope: c.scope, Key: c.key, AttemptToken: c.token, Epoch: epoch, Outcome: g.boundedOutcome(ctx, c, outcome, g.opts.maxOutcome)}
	return g.settle(ctx, c, epoch, lease, settlement{
		rpc: "Finish",
		call: func(ctx context.Context) error {
			// The record expires retention after the service stored it,
			// so after this by the service's clock.
			sent := time.Now()
			_, err := g.dedupe.Finish(ctx, req)
			if grpcerr.Reason(err) == reasonDedupeOutcomeTooLarge && req.GetOutcome().MessageName() != tooLargeName {
				req.Outcome = g.boundedOutcome(ctx, c, outcome, 0)
				_, err = g.dedupe.Finish(ctx, req)
			}
			if err == nil && g.replays != nil {
				g.replays.put(c.scope, c.key, c.begin.GetFingerprint(), cachedOutcome{outcome: req.GetOutcome(), completedAt: sent, expiresAt: sent.Add(c.retention)})
			}
			return err
		},
		retryEvent: eventFinishRetry,
		failEvent:  eventOutcomeLost,
		lost:       "the side effect ran and the caller got its response, but the outcome could not be stored",
	}, afterReply)
}

// settlement is one way to end a reservation: Finish or Release.
type settlement struct {
	// rpc names the Dedupe RPC, for logs.
	rpc string
	// call makes one attempt.
	call func(context.Context) error
	// retryEvent is counted for each attempt after the first; failEvent when
	// the settlement is given up or rejected.
	retryEvent, failEvent string
	// lost says what a settlement given up leaves behind.
	lost string
}

// settle ends the reservation and then stops renewing its lease. The first
// attempt runs before the caller gets its answer, so a duplicate right after
// it sees the result, and detached from the caller's context: a caller that
// timed out after the side effect ran must still leave its outcome behind.
// If the Dedupe service cannot take it, retries with backoff go on in the
// background within the finish retry budget (Close waits for them), and the
// lease is renewed all along: the reservation is still this attempt's, and a
// duplicate must neither take it over (REEXECUTE) nor find it lost while the
// store is briefly away.
//
// It reports whether that first attempt was refused because the attempt had
// been fenced.
//
// With inBackground even the first attempt runs in the background
// (FINISH_POLICY_AFTER_REPLY): settle returns at once, reporting false, and
// the lease is renewed until the matter is settled or given up, exactly as
// for the retries, so a duplicate meanwhile waits or is told the call is in
// flight. Close waits for it too, and stops it when its context ends first.
func (g *Gate) settle(ctx context.Context, c call, epoch int64, lease *leaseKeeper, s settlement, inBackground bool) (fenced bool) {
	lease.settling.Store(true)
	detached := context.WithoutCancel(ctx)
	if !inBackground {
		if settled, fenced := g.trySettle(detached, c, epoch, s); settled {
			lease.stop()
			return fenced
		}
	}
	g.background.Add(1)
	go func() {
		defer g.background.Done()
		defer lease.stop()
		bctx, cancel := context.WithCancel(detached)
		defer cancel()
		defer context.AfterFunc(g.backgroundCtx, cancel)()
		deadline := time.Now().Add(g.opts.finishBudget)
		if inBackground {
			if settled, _ := g.trySettle(bctx, c, epoch, s); settled {
				return
			}
		}
		backoff := 100 * time.Millisecond
		for time.Now().Add(backoff).Before(deadline) {
			if !sleep(bctx, backoff) {
				g.giveUp(ctx, c, epoch, s, "the Gate was closed")
				return
			}
			backoff = min(2*backoff, 5*time.Second)
			g.event(c, s.retryEvent)
			if settled, _ := g.trySettle(bctx, c, epoch, s); settled {
				return
			}
		}
		g.giveUp(ctx, c, epoch, s, "the retry budget ran out")
	}()
	return false
}

// giveUp counts and logs a settlement that will not be retried any more.
func (g *Gate) giveUp(ctx context.Context, c call, epoch int64, s settlement, why string) {
	g.event(c, s.failEvent)
	g.opts.logger.ErrorContext(ctx, "idemgate: gave up ("+why+"): "+s.lost+"; the key goes down its on_lost_outcome path when the lease runs out",
		slog.String("rpc", s.rpc), slog.String("scope", c.scope), slog.Int64("epoch", epoch), slog.Duration("budget", g.opts.finishBudget))
}

// sleep waits for d and reports true, or false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// trySettle makes one attempt and reports whether the matter is settled:
// done, or refused for good (fenced, or rejected), and whether it was
// fenced.
func (g *Gate) trySettle(ctx context.Context, c call, epoch int64, s settlement) (settled, fenced bool) {
	callCtx, cancel := context.WithTimeout(ctx, g.opts.outcomeTimeout)
	defer cancel()
	err := s.call(callCtx)
	switch status.Code(err) {
	case codes.OK:
		return true, false
	case codes.FailedPrecondition:
		g.event(c, eventFenced)
		g.opts.logger.WarnContext(ctx, "idemgate: refused because the reservation had been taken over or settled by another attempt (its lease ran out, or an operator resolved it); what the other attempt did stands",
			slog.String("rpc", s.rpc), slog.String("scope", c.scope), slog.Int64("epoch", epoch))
		return true, true
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.ResourceExhausted:
		g.event(c, s.failEvent)
		g.opts.logger.ErrorContext(ctx, "idemgate: the Dedupe service rejected this: "+s.lost,
			slog.String("rpc", s.rpc), slog.String("scope", c.scope), slog.Any("error", err))
		return true, false
	default:
		g.opts.logger.WarnContext(ctx, "idemgate: the Dedupe service could not take this; retrying",
			slog.String("rpc", s.rpc), slog.String("scope", c.scope), slog.Any("error", err))
		return false, false
	}
}

// refused reports whether a Begin error is the Dedupe service's definite
// refusal, so no reservation can have been made.
func refused(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented, codes.OutOfRange,
		codes.ResourceExhausted: // a quota refusal comes before the store reserves anything
		return true
	case codes.Internal:
		return grpcerr.Reason(err) == reasonDedupeOutcomeUnreadable
	}
	return false
}

// followUpLostBegin runs after a Begin whose answer never arrived (the
// Dedupe service crashed, the connection broke, the call's deadline fired):
// the reservation may have been made, and the handler certainly did not run,
// so it must not block the key. It re-sends the same Begin (the same attempt
// token, so the service recognises the attempt and answers reserved again if
// it holds the key) in the background until an answer arrives or the finish
// retry budget runs out, and releases what it finds reserved.
func (g *Gate) followUpLostBegin(ctx context.Context, c call) {
	g.event(c, eventBeginLost)
	select {
	case g.lostBegins <- struct{}{}:
	default:
		g.opts.logger.WarnContext(ctx, "idemgate: too many lost Begins are being followed up; if this one made a reservation, it runs down its lease",
			slog.String("scope", c.scope))
		return
	}
	req := proto.CloneOf(c.begin)
	req.MaxWait = durationpb.New(0)
	g.background.Add(1)
	go func() {
		defer g.background.Done()
		defer func() { <-g.lostBegins }()
		bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		defer context.AfterFunc(g.backgroundCtx, cancel)()
		deadline := time.Now().Add(g.opts.finishBudget)
		backoff := 50 * time.Millisecond
		for {
			callCtx, cancelCall := context.WithTimeout(bctx, g.opts.dedupeTimeout)
			res, err := g.dedupe.Begin(callCtx, req)
			cancelCall()
			if err == nil {
				if reserved := res.GetReserved(); reserved != nil {
					lease := g.keepLease(bctx, c, reserved.GetEpoch(), 0, func() {})
					g.release(bctx, c, reserved.GetEpoch(), false, lease)
				}
				return
			}
			if refused(err) || !time.Now().Add(backoff).Before(deadline) || !sleep(bctx, backoff) {
				g.opts.logger.ErrorContext(ctx, "idemgate: could not follow up a Begin whose answer was lost; if it made a reservation, the key goes down its on_lost_outcome path when the lease runs out",
					slog.String("scope", c.scope), slog.Any("error", err))
				return
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}()
}

// boundedOutcome returns outcome, or the ResultTooLarge marker that takes its
// place when it is over limit.
func (g *Gate) boundedOutcome(ctx context.Context, c call, outcome *anypb.Any, limit int) *anypb.Any {
	size := proto.Size(outcome)
	if size <= limit {
		return outcome
	}
	g.event(c, eventResultTooLarge)
	g.opts.logger.WarnContext(ctx, "idemgate: the outcome is over the size limit (the Gate's, or the Dedupe service's when it is lower); the caller got it, duplicates will get IDEMPOTENCY_RESULT_TOO_LARGE",
		slog.String("scope", c.scope), slog.Int("bytes", size), slog.Int("gate_limit", g.opts.maxOutcome))
	marker, err := marshalAny(&idemgatev1.ResultTooLarge{SizeBytes: int64(size), TypeUrl: resultTypeURL(outcome)})
	if err != nil {
		return outcome // cannot happen for this message; the service will refuse the big one
	}
	return marker
}

// replay returns the stored outcome: the method's response, or the final
// error it ended with, with the response metadata the handler set, and
// whether it replayed one. A stored type that is neither is an error, never
// a reason to run again.
func (g *Gate) replay(ctx context.Context, m *gatedMethod, outcome *anypb.Any) (any, error, bool) {
	outcome, md, err := unwrapOutcome(outcome)
	if err != nil {
		return nil, err, false
	}
	if outcome.MessageName() == tooLargeName {
		marker := &idemgatev1.ResultTooLarge{}
		_ = proto.Unmarshal(outcome.GetValue(), marker)
		return nil, grpcerr.New(codes.FailedPrecondition, ReasonResultTooLarge,
			fmt.Sprintf("this action already ran, but its outcome (%d bytes) was over the size limit and was not stored, so it cannot be replayed; the call was not run again", marker.GetSizeBytes()),
			map[string]string{"size_bytes": strconv.FormatInt(marker.GetSizeBytes(), 10)}, 0), false
	}
	if outcome.MessageName() == statusName {
		st := &spb.Status{}
		if err := proto.Unmarshal(outcome.GetValue(), st); err != nil {
			return nil, grpcerr.New(codes.Internal, ReasonOutcomeTypeMismatch,
				fmt.Sprintf("the stored error outcome does not decode: %v; the call was not run again", err), nil, 0), false
		}
		g.markReplayed(ctx)
		g.replayMetadata(ctx, md)
		return nil, status.FromProto(st).Err(), true
	}
	if outcome.MessageName() != m.outputName {
		return nil, grpcerr.New(codes.Internal, ReasonOutcomeTypeMismatch,
			fmt.Sprintf("the stored outcome is a %s, not this method's response type %s; the call was not run again", outcome.MessageName(), m.outputName),
			nil, 0), false
	}
	resp := m.output.New().Interface()
	if err := proto.Unmarshal(outcome.GetValue(), resp); err != nil {
		return nil, grpcerr.New(codes.Internal, ReasonOutcomeTypeMismatch,
			fmt.Sprintf("the stored outcome does not decode as %s: %v; the call was not run again", m.outputName, err), nil, 0), false
	}
	g.markReplayed(ctx)
	g.replayMetadata(ctx, md)
	return resp, nil, true
}

func (g *Gate) markReplayed(ctx context.Context) {
	if err := grpc.SetHeader(ctx, metadata.Pairs(ReplayedHeader, "true")); err != nil {
		g.opts.logger.WarnContext(ctx, "idemgate: could not set the replayed header", slog.Any("error", err))
	}
}

var (
	statusName   = (&spb.Status{}).ProtoReflect().Descriptor().FullName()
	tooLargeName = (&idemgatev1.ResultTooLarge{}).ProtoReflect().Descriptor().FullName()
)

func marshalAny(m proto.Message) (*anypb.Any, error) {
	outcome := &anypb.Any{}
	err := anypb.MarshalFrom(outcome, m, proto.MarshalOptions{Deterministic: true})
	return outcome, err
}

// beginError maps a failed Begin. The caller's own cancellation stays what it
// is; a Dedupe service that is down or overloaded fails closed as
// UNAVAILABLE; a Dedupe service that refused the request is a
// misconfiguration, INTERNAL.
func (g *Gate) beginError(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return status.FromContextError(ctxErr).Err()
	}
	switch status.Code(err) {
	case codes.ResourceExhausted:
		// A quota of this tool server at the Dedupe service: the store is
		// fine, and retrying at once only spends the quota again.
		retry, _ := grpcerr.RetryDelay(err)
		return grpcerr.New(codes.ResourceExhausted, ReasonQuotaExceeded,
			"this tool server is over its quota at the Dedupe service ("+status.Convert(err).Message()+"); the handler did not run",
			map[string]string{"quota": quotaOf(err)}, retry)
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented, codes.OutOfRange:
		return grpcerr.New(codes.Internal, ReasonStoreRejected,
			"the Dedupe service refused the reservation: "+status.Convert(err).Message()+"; the handler did not run", nil, 0)
	case codes.Internal:
		if grpcerr.Reason(err) == reasonDedupeOutcomeUnreadable {
			// Retrying cannot help until an operator restores the key.
			return grpcerr.New(codes.Internal, ReasonStoreRejected,
				"the Dedupe service holds this action's outcome but cannot read it ("+status.Convert(err).Message()+"); the handler did not run, and will not until an operator restores the outcome key", nil, 0)
		}
		return grpcerr.New(codes.Unavailable, ReasonStoreUnavailable,
			"the Dedupe service failed, so the call was not run (fail closed); retry with the same idempotency key",
			nil, g.opts.storeRetry)
	default:
		return grpcerr.New(codes.Unavailable, ReasonStoreUnavailable,
			"the Dedupe service is unavailable, so the call was not run (fail closed); retry with the same idempotency key",
			nil, g.opts.storeRetry)
	}
}

// quotaOf returns the quota a Dedupe service's RESOURCE_EXHAUSTED names in
// its ErrorInfo metadata, or "" when it names none.
func quotaOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetMetadata()["quota"]
		}
	}
	return ""
}

// derivedKeyPrefix starts every key derived from a keyless call's
// fingerprint, so it never collides with a caller's key of the same text.
const derivedKeyPrefix = "derived:"

// keyOf returns the call's idempotency key from the metadata or the request's
// key field, "" for a keyless call the policy deduplicates on its
// fingerprint, or the status error to refuse the call with.
func (m *gatedMethod) keyOf(ctx context.Context, req proto.Message) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(KeyHeader)
	key, hasKey := "", len(values) > 0
	if hasKey {
		key = values[0]
		for _, v := range values[1:] {
			if v != key {
				return "", grpcerr.New(codes.InvalidArgument, ReasonKeyInvalid,
					"the "+KeyHeader+" metadata has more than one value; send exactly one key", nil, 0)
			}
		}
	}
	if m.keyField != nil {
		if fieldKey := req.ProtoReflect().Get(m.keyField).String(); fieldKey != "" {
			if hasKey && fieldKey != key {
				return "", grpcerr.New(codes.InvalidArgument, ReasonKeyConflict,
					fmt.Sprintf("the %s metadata and the request field %s carry different idempotency keys; send one, or the same in both", KeyHeader, m.keyField.Name()),
					map[string]string{"field": string(m.keyField.Name())}, 0)
			}
			key, hasKey = fieldKey, true
		}
	}
	if !hasKey {
		if m.policy.KeylessFingerprint {
			return "", nil
		}
		where := "the " + KeyHeader + " metadata"
		if m.keyField != nil {
			where += " or the request field " + string(m.keyField.Name())
		}
		return "", grpcerr.New(codes.InvalidArgument, ReasonKeyMissing,
			"this method has side effects and needs an idempotency key: send one in "+where+", minted once per logical action and reused on every retry of it",
			nil, 0)
	}
	if err := keys.Validate(key); err != nil {
		return "", grpcerr.New(codes.InvalidArgument, ReasonKeyInvalid,
			"the idempotency key "+err.Error()+": use 1 to 255 bytes of printable ASCII without leading or trailing spaces, such as a UUID", nil, 0)
	}
	return key, nil
}

// fingerprint hashes the deterministic encoding of the request, without its
// key field and its fields marked exclude_from_fingerprint. Deterministic
// encoding sorts map entries, so map order never changes it.
func (m *gatedMethod) fingerprint(req proto.Message) ([]byte, error) {
	if m.scrub {
		req = proto.Clone(req)
		if m.keyField != nil {
			req.ProtoReflect().Clear(m.keyField)
		}
		clearExcluded(req.ProtoReflect())
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

// clearExcluded clears every populated field marked exclude_from_fingerprint
// in msg and in the messages it holds.
func clearExcluded(msg protoreflect.Message) {
	msg.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fieldPolicy(fd).GetExcludeFromFingerprint():
			msg.Clear(fd)
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					clearExcluded(mv.Message())
					return true
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				list := v.List()
				for i := range list.Len() {
					clearExcluded(list.Get(i).Message())
				}
			}
		case fd.Message() != nil:
			clearExcluded(v.Message())
		}
		return true
	})
}

// scopeOf joins the method and the tenant. A full method name never holds
// "|", so the first "|" splits the two unambiguously.
func scopeOf(fullMethod, tenant string) string {
	if tenant == "" {
		return fullMethod
	}
	var b strings.Builder
	b.Grow(len(fullMethod) + 1 + len(tenant))
	b.WriteString(fullMethod)
	b.WriteByte('|')
	b.WriteString(tenant)
	return b.String()
}

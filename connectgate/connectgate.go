package connectgate

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/protogate"
	"github.com/idemgate/idemgate/internal/replayfields"
)

// The gate reads and writes the headers of package idemgate's metadata names
// (idemgate.KeyHeader and the rest), which HTTP spells case-insensitively
// (Idempotency-Key).

// Gate holds the resolved policies of every procedure and a client of the
// Dedupe service. It is safe for concurrent use.
type Gate struct {
	// dedupe is the observed client of the Dedupe service (gatecore's
	// Observer): the engine's, and CheckDedupe's and WatchDedupe's.
	dedupe  *gatecore.Observer
	engine  *gatecore.Engine
	methods map[string]*protogate.Method
	opts    options
	metrics *metrics
	limitsState
}

// New resolves the policy of every method in the descriptor registry (see
// WithFiles) and returns a Gate that deduplicates the gated ones through
// dedupe. It fails, naming each method, when a policy is inconsistent, as
// interceptor.New does: a method marked both mutating and NO_SIDE_EFFECTS, a
// streaming method marked mutating, a value out of range, or a reconciler for
// a procedure that is not gated.
func New(dedupe idemgatev1.DedupeServiceClient, opts ...Option) (*Gate, error) {
	if dedupe == nil {
		return nil, errors.New("idemgate: connectgate.New needs a Dedupe service client, got nil")
	}
	o := defaultOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxRequest <= 0 || o.maxResponse <= 0 {
		return nil, fmt.Errorf("idemgate: connectgate.New: WithMaxRequestBytes (%d) and WithMaxResponseBytes (%d) must be positive", o.maxRequest, o.maxResponse)
	}
	if o.maxOutcome > o.maxResponse {
		// A response stored within the outcome limit but over the send
		// limit would be refused to every duplicate it is replayed to.
		return nil, fmt.Errorf("idemgate: connectgate.New: WithMaxOutcomeBytes (%d) is over WithMaxResponseBytes (%d): a stored response that large could never be sent again; lower the first or raise the second", o.maxOutcome, o.maxResponse)
	}
	o.perCaller = replayfields.New(o.perCallerNames...)
	// A response replays as its generated type when the binary links it in
	// (the interceptor's default registry), else as a dynamicpb message of
	// the method's output descriptor (see the package doc).
	r, err := protogate.Resolve(o.files, protoregistry.GlobalTypes, o.reconcilers)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(o.registerer)
	if err != nil {
		return nil, err
	}
	observed := gatecore.NewObserver(dedupe, o.dedupeConn, o.logger, o.dedupeLogEvery)
	engine := gatecore.New(observed, gatecore.Options{
		ReplayCache: gatecore.NewReplayCache(o.replayEntries, o.replayBytes, o.replayTTL),
		Logger:      o.logger, DedupeTimeout: o.dedupeTimeout, OutcomeTimeout: o.outcomeTimeout, FinishBudget: o.finishBudget,
		InFlightRetry: o.inFlightRetry, StoreRetry: o.storeRetry, MaxOutcome: o.maxOutcome, TypeURLOf: protogate.ResultTypeURL,
		OnEvent: m.event, OnStage: m.stage,
	})
	return &Gate{dedupe: observed, engine: engine, methods: r.Gated, opts: o, metrics: m}, nil
}

// CheckDedupe asks the Dedupe service whether it serves this tool server,
// as interceptor.Gate.CheckDedupe does; nil means gated calls can reach it.
func (g *Gate) CheckDedupe(ctx context.Context) error {
	return g.dedupe.Check(ctx, g.opts.dedupeTimeout)
}

// WatchDedupe keeps hs's status for idemgate.DedupeHealthService in step
// with the Dedupe service until ctx ends, as interceptor.Gate.WatchDedupe
// does. A server that runs both gates on one Dedupe connection needs only
// one of them watched.
func (g *Gate) WatchDedupe(ctx context.Context, hs idemgate.HealthSetter) { g.dedupe.Watch(ctx, hs) }

// Close waits until every outcome still being retried in the background,
// and every FINISH_POLICY_AFTER_REPLY outcome not yet stored, is settled or
// given up, as interceptor.Gate.Close does. Call it after the HTTP server
// stopped.
func (g *Gate) Close(ctx context.Context) error { return g.engine.Close(ctx) }

// Stats is what the gate did that no caller saw (the interceptor's Stats).
type Stats = gatecore.Stats

// Stats returns the counters since New.
func (g *Gate) Stats() Stats { return g.engine.Stats() }

// Policy returns the resolved policy of a procedure ("/pkg.Service/Method");
// one it does not gate reports Gated false.
func (g *Gate) Policy(procedure string) idemgate.Policy {
	if m, ok := g.methods[procedure]; ok {
		return m.Policy
	}
	return idemgate.Policy{}
}

// gateInterceptor is the gate's interceptor, which HandlerOptions adds with
// the gate's codecs and limits. Add it with connect.WithInterceptors-style
// options after authentication (the tenant function may read the caller's
// identity) and after any panic recovery (a panicking handler is a lost
// outcome, and the gate panics again), before anything that retries the
// handler. On a client it does nothing, and streams pass through: a streaming
// method marked mutating makes New fail, because a stream's outcome is not
// one message to store and replay.
type gateInterceptor struct {
	g *Gate
}

func (i gateInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		spec := req.Spec()
		m, ok := i.g.methods[spec.Procedure]
		if !ok || spec.IsClient {
			return next(ctx, req)
		}
		return i.g.gate(ctx, req, m, next)
	}
}

func (gateInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (gateInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// call is one gated call: its identity in the Dedupe service (the core's
// Call) and what the core needs of Connect to run it (gatecore.Transport).
type call struct {
	*gatecore.Call
	g      *Gate
	method *protogate.Method
	req    connect.AnyRequest
	next   connect.UnaryFunc
	// own holds the gate's own response headers, set on the answer.
	own http.Header
	// verdict is what the handler's answer meant, 0 when it did not run.
	verdict gatecore.Verdict
}

func (g *Gate) gate(ctx context.Context, req connect.AnyRequest, m *protogate.Method, next connect.UnaryFunc) (connect.AnyResponse, error) {
	arrived := time.Now()
	c := &call{g: g, method: m, req: req, next: next, own: http.Header{}}
	answer, result, err := c.gate(ctx, arrived)
	g.metrics.call(req.Spec().Procedure, result, c.verdict, err)
	return c.answer(answer, err)
}

// gate runs the call through the core; before it, the key, the tenant and
// the fingerprint may refuse it.
func (c *call) gate(ctx context.Context, arrived time.Time) (any, gatecore.Result, error) {
	g, m, req := c.g, c.method, c.req
	procedure := req.Spec().Procedure
	msg, ok := req.Any().(proto.Message)
	if !ok {
		return nil, gatecore.ResultRefused, connect.NewError(connect.CodeInternal, fmt.Errorf("idemgate: request of %s is %T, not a protobuf message", procedure, req.Any()))
	}
	key, err := m.Key("the "+idemgate.KeyHeader+" header", req.Header().Values(idemgate.KeyHeader), msg)
	if err != nil {
		return nil, gatecore.ResultRefused, err
	}
	tenant, err := g.opts.tenant(ctx)
	if err != nil {
		return nil, gatecore.ResultRefused, err
	}
	fingerprint, err := m.Fingerprint(msg)
	if err != nil {
		return nil, gatecore.ResultRefused, status.Errorf(codes.Internal, "idemgate: fingerprint the request of %s: %v", procedure, err)
	}
	retention := m.Policy.Retention
	if key == "" {
		// KEYLESS_POLICY_FINGERPRINT: the request names the action, for the
		// window only.
		key = protogate.DerivedKeyPrefix + hex.EncodeToString(fingerprint)
		retention = m.Policy.KeylessWindow
		c.own.Set(idemgate.KeyDerivedHeader, "true")
	}
	c.Call = gatecore.NewCall(procedure, protogate.Scope(m.Policy.Action, tenant), key, fingerprint, m.CorePolicy(), retention)
	if m.Reconcile != nil {
		c.Reconcile = func(ctx context.Context) (gatecore.Resolution, error) {
			return m.Reconciled(ctx, procedure, c.Key, msg, statusOf)
		}
	}
	return g.engine.Gate(ctx, c.Call, c, arrived)
}

// answer is what the caller gets: the response, or the error as a
// *connect.Error, with the gate's own headers.
func (c *call) answer(answer any, err error) (connect.AnyResponse, error) {
	if err != nil {
		ce := connectError(err)
		if len(c.own) > 0 {
			// The handler's own error may be shared (a package-level
			// value): the gate's headers go on a copy.
			ce = copyError(ce)
			mergeHeader(ce.Meta(), c.own)
		}
		return nil, ce
	}
	resp, ok := answer.(connect.AnyResponse)
	if !ok || resp == nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemgate: the gate answered %T, not a connect response", answer))
	}
	mergeHeader(resp.Header(), c.own)
	return resp, nil
}

// Replay implements gatecore.Transport: the stored outcome, as a response of
// the method's type (its generated type, or a dynamicpb message when the
// binary lacks it) or the final error, with the metadata the handler set.
func (c *call) Replay(_ context.Context, s gatecore.Stored) (any, error, bool) {
	if !s.CompletedAt.IsZero() {
		c.own.Set(idemgate.OriginalTimeHeader, headerTimeText(s.CompletedAt))
	}
	if !s.ExpiresAt.IsZero() {
		c.own.Set(idemgate.ExpiresAtHeader, headerTimeText(s.ExpiresAt))
	}
	r, err := c.method.Decode(s.Outcome)
	if err != nil {
		return nil, err, false
	}
	c.own.Set(idemgate.ReplayedHeader, "true")
	if r.Err != nil {
		ce := connectError(r.Err)
		// A unary handler's error sends its metadata as headers, whatever
		// the protocol: the stored trailer goes there too.
		setStored(ce.Meta(), r.Header, c.g.replayable)
		setStored(ce.Meta(), r.Trailer, c.g.replayable)
		return nil, ce, true
	}
	if r.Response == nil {
		return nil, grpcerr.New(codes.Internal, idemgate.ReasonOutcomeTypeMismatch,
			"the stored outcome decoded as no message; the call was not run again", nil, 0), false
	}
	resp := connect.NewResponse(&replayedMessage{r.Response})
	setStored(resp.Header(), r.Header, c.g.replayable)
	setStored(resp.Trailer(), r.Trailer, c.g.replayable)
	return resp, nil, true
}

// replayedMessage is a replayed response: the method's response type, as
// connect.NewResponse needs a type parameter the gate does not know. Its
// pointer is the proto.Message the codecs encode, through the embedded
// message's reflection, so a generated type encodes as the handler's
// response did.
type replayedMessage struct{ proto.Message }

// Committed implements gatecore.Transport: the caller learns until when the
// outcome is replayed.
func (c *call) Committed(_ context.Context, expiresAt time.Time) {
	c.own.Set(idemgate.ExpiresAtHeader, headerTimeText(expiresAt))
}

// Run implements gatecore.Transport: the handler, on the attempt's context
// with the call's identity, the response metadata it set (on its response,
// its error, or the context's connect.CallInfo) recorded, and what its
// answer means.
func (c *call) Run(hctx context.Context, a *gatecore.Attempt) gatecore.Ran {
	ran := c.run(hctx, a)
	c.verdict = ran.Verdict
	return ran
}

func (c *call) run(hctx context.Context, a *gatecore.Attempt) gatecore.Ran {
	info, hasInfo := connect.CallInfoForHandlerContext(hctx)
	var headerBefore, trailerBefore http.Header
	if hasInfo {
		headerBefore, trailerBefore = info.ResponseHeader().Clone(), info.ResponseTrailer().Clone()
	}
	resp, handlerErr := c.next(hctx, c.req)
	var header, trailer protogate.Metadata
	if hasInfo {
		recordAdded(&header, info.ResponseHeader(), headerBefore)
		recordAdded(&trailer, info.ResponseTrailer(), trailerBefore)
	}
	if handlerErr != nil {
		var ce *connect.Error
		if errors.As(handlerErr, &ce) {
			recordAdded(&header, ce.Meta(), nil)
		}
		verdict, st, unwrapped := c.method.Classify(handlerErr, statusOf)
		switch verdict {
		case gatecore.VerdictNotRun:
			return gatecore.Ran{Verdict: verdict, Answer: resp, Err: unwrapped}
		case gatecore.VerdictUnknown:
			return gatecore.Ran{Verdict: verdict, Answer: resp, Err: unwrapped, Code: grpcerr.CodeName(st.Code()), Message: st.Message()}
		}
		result, err := gatecore.MarshalAny(st.Proto())
		outcome, err := protogate.Wrap(result, err, header, trailer, c.g.replayable)
		if err != nil {
			c.g.opts.logger.ErrorContext(hctx, "idemgate: could not serialize a final error to store it; releasing instead", slog.String("scope", c.Scope), slog.Any("error", err))
			return gatecore.Ran{Verdict: gatecore.VerdictNotRun, Answer: resp, Err: unwrapped}
		}
		// The caller gets what duplicates will be replayed: the stored
		// status, with the metadata the handler put on its error.
		answer := connectError(status.FromProto(st.Proto()).Err())
		if ce != nil {
			// Only what the stored copy keeps, so the first caller and its
			// duplicates get the same metadata, and the per-caller fields,
			// which only the first caller gets.
			for k, vs := range ce.Meta() {
				if lower := strings.ToLower(k); c.g.replayable(lower) || c.g.opts.perCaller.PerCaller(lower) {
					for _, v := range vs {
						answer.Meta().Add(k, v)
					}
				}
			}
		}
		return gatecore.Ran{Verdict: gatecore.VerdictOutcome, Outcome: outcome, Err: answer}
	}
	respMsg, ok := resp.Any().(proto.Message)
	if !ok {
		return gatecore.Ran{Verdict: gatecore.VerdictAbandoned, Answer: resp} // the codec will refuse it anyway
	}
	recordAdded(&header, resp.Header(), nil)
	recordAdded(&trailer, resp.Trailer(), nil)
	result, err := gatecore.MarshalAny(respMsg)
	outcome, err := protogate.Wrap(result, err, header, trailer, c.g.replayable)
	if err != nil {
		return gatecore.Ran{Verdict: gatecore.VerdictLost, Answer: resp, Why: "could not serialize the response to store it", Attrs: []slog.Attr{slog.Any("error", err)}}
	}
	return gatecore.Ran{Verdict: gatecore.VerdictOutcome, Outcome: outcome, Answer: resp}
}

// headerTimeText spells a time as the gate's time headers carry it.
func headerTimeText(t time.Time) string {
	return gatecore.HeaderTime(t)
}

// statusOf reads a handler's error as a gRPC status: a *connect.Error by its
// code, message and details, anything else as status.Convert does (a gRPC
// status error keeps its status; a plain error is UNKNOWN, as connect-go
// answers it).
func statusOf(err error) *status.Status {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return status.Convert(err)
	}
	p := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()}
	for _, d := range ce.Details() {
		p.Details = append(p.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	return status.FromProto(p)
}

// copyError is a new *connect.Error with ce's code, wrapped error, details
// and metadata.
func copyError(ce *connect.Error) *connect.Error {
	out := connect.NewError(ce.Code(), ce.Unwrap())
	for _, d := range ce.Details() {
		out.AddDetail(d)
	}
	for k, vs := range ce.Meta() {
		out.Meta()[k] = append([]string(nil), vs...)
	}
	return out
}

// connectError is err as a *connect.Error: itself when it is one, else its
// gRPC status (the gate's refusals are grpcerr status errors) with the same
// code, message and details (ErrorInfo, RetryInfo).
func connectError(err error) *connect.Error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	st, ok := status.FromError(err)
	if !ok {
		return connect.NewError(connect.CodeUnknown, err)
	}
	code := connect.Code(st.Code())
	if st.Code() == codes.OK {
		code = connect.CodeUnknown
	}
	out := connect.NewError(code, errors.New(st.Message()))
	for _, d := range st.Proto().GetDetails() {
		if detail, err := connect.NewErrorDetail(d); err == nil {
			out.AddDetail(detail)
		}
	}
	return out
}

// mergeHeader adds every value of from to into.
func mergeHeader(into, from http.Header) {
	for k, vs := range from {
		for _, v := range vs {
			into.Add(k, v)
		}
	}
}

// recordAdded records into *md the values h holds beyond those it held
// before (nil: all of them), keys lowercased and "-bin" values decoded, as
// the interceptor stores them, so a record replays alike over gRPC.
func recordAdded(md *protogate.Metadata, h, before http.Header) {
	for k, vs := range h {
		vs = vs[min(len(before[k]), len(vs)):]
		if len(vs) == 0 {
			continue
		}
		lower := strings.ToLower(k)
		if strings.HasSuffix(lower, "-bin") {
			raw := make([]string, len(vs))
			for i, v := range vs {
				b, err := connect.DecodeBinaryHeader(v)
				if err != nil {
					b = []byte(v)
				}
				raw[i] = string(b)
			}
			vs = raw
		}
		md.Add(lower, vs...)
	}
}

// setStored sets stored metadata on h, "-bin" values encoded as HTTP
// carries them, and only the keys keep holds: a record stored before a key
// became per-caller (or was named by WithPerCallerHeaders) replays without
// it.
func setStored(h http.Header, md protogate.Metadata, keep func(string) bool) {
	for k, vs := range md {
		if !keep(k) {
			continue
		}
		for _, v := range vs {
			if strings.HasSuffix(k, "-bin") {
				v = connect.EncodeBinaryHeader([]byte(v))
			}
			h.Add(k, v)
		}
	}
}

// replayable reports whether a handler's response header (lowercase) is
// stored and replayed: what the interceptor replays (protogate.ReplayableKey),
// less what HTTP and the Connect protocol own and the per-caller fields
// (internal/replayfields, with WithPerCallerHeaders').
func (g *Gate) replayable(k string) bool {
	if !protogate.ReplayableKey(k, idemgate.ReplayedHeader, idemgate.KeyDerivedHeader, idemgate.ExpiresAtHeader, idemgate.OriginalTimeHeader) || strings.HasPrefix(k, "connect-") || !g.opts.perCaller.Stored(k) {
		return false
	}
	switch k {
	case "content-encoding", "accept-encoding", "host":
		return false
	}
	return true
}

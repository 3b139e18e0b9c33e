package httpgate

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/keys"
	"github.com/idemgate/idemgate/internal/replayfields"
)

// Header fields the gate reads and writes (the gRPC gate's metadata names,
// in HTTP's canonical form).
const (
	// KeyHeader is the request field that carries the idempotency key, an
	// sf-string (ParseKey).
	KeyHeader = "Idempotency-Key"
	// ReplayedHeader is set to "true" on a response replayed from a stored
	// outcome instead of a fresh execution.
	ReplayedHeader = "Idempotency-Replayed"
	// KeyDerivedHeader is set to "true" when a keyless request was
	// deduplicated on its fingerprint (KeylessFingerprint).
	KeyDerivedHeader = "Idempotency-Key-Derived"
	// ExpiresAtHeader, an RFC 3339 UTC time to the millisecond
	// (2026-12-01T11:24:00.349Z), says until when the outcome is replayed:
	// on a replay the record's expiry as the Dedupe service holds it; on a
	// first execution when this process stored (or, under FinishAfterReply,
	// answered) it plus the retention, by its clock.
	ExpiresAtHeader = "Idempotency-Expires-At"
	// OriginalTimeHeader, an RFC 3339 UTC time to the millisecond, is on
	// every answer from a stored outcome: when that outcome was stored.
	OriginalTimeHeader = "Idempotency-Original-Time"
)

// Gate is net/http middleware that runs each gated request's handler once
// per idempotency key. It is safe for concurrent use.
type Gate struct {
	api     string
	dedupe  *gatecore.Observer
	engine  *gatecore.Engine
	opts    options
	metrics *metrics
	// rules matches WithRoute patterns; its handlers are *route.
	rules *http.ServeMux
	// byMethod is the route of a request gated by its method.
	byMethod *route
	methods  map[string]bool
}

// route is one policy, its defaults applied.
type route struct {
	pattern string
	policy  RoutePolicy
}

// ServeHTTP makes a route a handler of the rules mux; it is never called.
func (*route) ServeHTTP(http.ResponseWriter, *http.Request) {}

// New returns a Gate that deduplicates through dedupe the requests of the
// API named api (printable ASCII without "|", up to 100 bytes), which
// namespaces its records so two APIs sharing a Dedupe namespace never share
// one. It fails, naming each, on an invalid or conflicting route pattern or
// a policy out of range.
func New(dedupe idemgatev1.DedupeServiceClient, api string, opts ...Option) (*Gate, error) {
	if dedupe == nil {
		return nil, errors.New("httpgate: New needs a Dedupe service client, got nil")
	}
	if api == "" || len(api) > 100 || !keys.Printable(api) || strings.Contains(api, "|") {
		return nil, fmt.Errorf("httpgate: the API name %q must be 1 to 100 bytes of printable ASCII without \"|\"", api)
	}
	o := defaultOptions
	for _, opt := range opts {
		opt(&o)
	}
	o.perCaller = replayfields.New(o.perCallerNames...)
	if o.tenant == nil {
		return nil, errors.New("httpgate: WithTenant was given nil")
	}
	g := &Gate{api: api, opts: o, rules: http.NewServeMux(), methods: map[string]bool{}}
	for _, m := range o.methods {
		g.methods[strings.ToUpper(m)] = true
	}
	var problems []string
	if err := checkPolicy("WithDefaultPolicy", o.defaultPolicy); err != nil {
		problems = append(problems, err.Error())
	}
	g.byMethod = &route{policy: withDefaults(o.defaultPolicy)}
	for _, rule := range o.routes {
		if err := checkPolicy(fmt.Sprintf("route %q", rule.pattern), rule.policy); err != nil {
			problems = append(problems, err.Error())
			continue
		}
		if err := register(g.rules, rule.pattern, &route{pattern: rule.pattern, policy: withDefaults(rule.policy)}); err != nil {
			problems = append(problems, fmt.Sprintf("route %q: %v", rule.pattern, err))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return nil, fmt.Errorf("httpgate: %s", strings.Join(problems, "; "))
	}
	var err error
	if g.metrics, err = newMetrics(o.registerer); err != nil {
		return nil, err
	}
	g.dedupe = gatecore.NewObserver(dedupe, o.dedupeConn, o.logger, o.dedupeLogEvery)
	g.engine = gatecore.New(g.dedupe, gatecore.Options{
		ReplayCache: gatecore.NewReplayCache(o.replayEntries, o.replayBytes, o.replayTTL),
		Logger:      o.logger, DedupeTimeout: o.dedupeTimeout, OutcomeTimeout: o.outcomeTimeout, FinishBudget: o.finishBudget,
		InFlightRetry: o.inFlightRetry, StoreRetry: o.storeRetry, MaxOutcome: o.maxOutcome,
		OnEvent: g.metrics.event, OnStage: g.metrics.stage,
	})
	return g, nil
}

// register adds a pattern to the rules mux, turning ServeMux's panic on an
// invalid or conflicting pattern into an error.
func register(mux *http.ServeMux, pattern string, r *route) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	mux.Handle(pattern, r)
	return nil
}

func checkPolicy(name string, p RoutePolicy) error {
	if p.NotGated {
		return nil
	}
	if err := durationsOf(p).Check(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if p.MaxBodyBytes < 0 {
		return fmt.Errorf("%s: MaxBodyBytes %d is negative", name, p.MaxBodyBytes)
	}
	return nil
}

// durationsOf is p's durations, as the core checks and defaults them.
func durationsOf(p RoutePolicy) gatecore.Durations {
	return gatecore.Durations{Retention: p.Retention, Lease: p.Lease, MaxWait: p.MaxWait, ExecutionTimeout: p.ExecutionTimeout,
		KeylessWindow: p.KeylessWindow, Keyless: p.KeylessFingerprint, NoWait: p.NoWait}
}

// withDefaults is p with the core's default for every zero field.
func withDefaults(p RoutePolicy) RoutePolicy {
	d := durationsOf(p).WithDefaults()
	p.Retention, p.Lease, p.MaxWait, p.ExecutionTimeout, p.KeylessWindow = d.Retention, d.Lease, d.MaxWait, d.ExecutionTimeout, d.KeylessWindow
	if p.MaxBodyBytes == 0 {
		p.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if p.OnLostOutcome == idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_UNSPECIFIED {
		p.OnLostOutcome = idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED
	}
	return p
}

// Policy returns the policy the gate applies to r and whether r is gated:
// the most specific WithRoute pattern that matches it decides, else its
// method (WithGatedMethods) with WithDefaultPolicy. Defaults are filled in.
func (g *Gate) Policy(r *http.Request) (p RoutePolicy, gated bool) {
	rt := g.routeOf(r)
	if rt == nil {
		return RoutePolicy{NotGated: true}, false
	}
	return rt.policy, true
}

// routeOf is r's route, nil when r is not gated.
func (g *Gate) routeOf(r *http.Request) *route {
	if h, _ := g.rules.Handler(r); h != nil {
		if rt, ok := h.(*route); ok {
			if rt.policy.NotGated {
				return nil
			}
			return rt
		}
	}
	if g.methods[r.Method] {
		return g.byMethod
	}
	return nil
}

// Handler returns next gated: each gated request's handler runs once per
// idempotency key, its response stored and replayed to every duplicate. Put
// it after authentication (the TenantFunc may read the caller's identity)
// and after panic recovery that answers (a panicking handler is a lost
// outcome, and the gate panics again). When next is an *http.ServeMux, a
// request gated by its method is labelled with the mux pattern it is
// routed to; else with its method and "*".
func (g *Gate) Handler(next http.Handler) http.Handler {
	mux, _ := next.(*http.ServeMux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt := g.routeOf(r)
		if rt == nil {
			next.ServeHTTP(w, r)
			return
		}
		label := rt.pattern
		if label == "" && mux != nil {
			_, label = mux.Handler(r)
		}
		if label == "" {
			label = r.Method + " *"
		}
		g.serve(w, r, next, rt, label)
	})
}

// derivedKeyPrefix starts every key derived from a keyless request's
// fingerprint, as the other gates' do.
const derivedKeyPrefix = "derived:"

// call is one gated request: its identity in the Dedupe service (the
// core's Call) and what the core needs of HTTP to run it
// (gatecore.Transport).
type call struct {
	*gatecore.Call
	g      *Gate
	route  *route
	r      *http.Request
	body   []byte
	next   http.Handler
	header http.Header // the gate's own response headers
	// verdict is what the handler's response meant, 0 when it did not run.
	verdict gatecore.Verdict
}

func (g *Gate) serve(w http.ResponseWriter, r *http.Request, next http.Handler, rt *route, label string) {
	arrived := time.Now()
	p := rt.policy
	key, hasKey, err := keyOf(r.Header)
	if err != nil {
		g.refuse(w, label, g.problem(idemgate.ReasonKeyInvalid, err.Error()+
			`; send exactly one Idempotency-Key field holding 1 to 255 printable ASCII bytes, quoted as the draft's sf-string ("8e03978e-40d5-43e8-bc93-6894a57f9324") or bare`), nil)
		return
	}
	if !hasKey && !p.KeylessFingerprint {
		g.refuse(w, label, g.problem(idemgate.ReasonKeyMissing,
			"this request has side effects and needs an Idempotency-Key header: mint one per logical action (a UUID), send it quoted (Idempotency-Key: \"...\"), and reuse it on every retry of that action"), nil)
		return
	}
	body, err := readBody(w, r, p.MaxBodyBytes)
	if errors.Is(err, errBodyTooLarge) {
		g.refuse(w, label, g.problem(ReasonRequestTooLarge,
			fmt.Sprintf("the request body is over this route's limit of %d bytes, so it was not read and nothing ran; send a smaller body", p.MaxBodyBytes)), nil)
		return
	}
	if err != nil {
		g.refuse(w, label, Problem{Type: "about:blank", Title: "Request body unreadable", Status: http.StatusBadRequest,
			Detail: "the request body could not be read (" + err.Error() + "); nothing ran: retry with the same key"}, nil)
		return
	}
	tenant, err := g.opts.tenant(r)
	if err != nil {
		g.refuse(w, label, g.problem(ReasonUnauthenticated, err.Error()), nil)
		return
	}
	fingerprint := Fingerprint(r, label, p.FingerprintHeaders, body)
	retention := p.Retention
	c := &call{g: g, route: rt, r: r, body: body, next: next, header: http.Header{}}
	if !hasKey {
		key, retention = derivedKeyPrefix+hex.EncodeToString(fingerprint), p.KeylessWindow
		c.header.Set(KeyDerivedHeader, "true")
	}
	c.Call = gatecore.NewCall(label, g.scopeOf(label, tenant), key, fingerprint, gatecore.Policy{
		Lease: p.Lease, MaxWait: p.MaxWait, OnLostOutcome: p.OnLostOutcome, ExecutionTimeout: p.ExecutionTimeout,
		FinishAfterReply: p.FinishAfterReply,
	}, retention)
	if p.Reconciler != nil {
		c.Reconcile = func(ctx context.Context) (gatecore.Resolution, error) { return c.reconcile(ctx, key) }
	}
	ans, result, err := g.engine.Gate(r.Context(), c.Call, c, arrived)
	if err != nil {
		g.refuse(w, label, g.problemOf(err), c.header)
		return
	}
	a, _ := ans.(*answer)
	if a == nil {
		g.refuse(w, label, Problem{Type: "about:blank", Title: "Internal error", Status: http.StatusInternalServerError, Detail: "the gate has no response to send"}, c.header)
		return
	}
	a.write(w)
	outcome := string(result)
	if result == gatecore.ResultExecuted && c.verdict == gatecore.VerdictNotRun {
		outcome = "released"
	}
	g.metrics.request(label, outcome)
}

// refuse answers with a problem and counts it.
func (g *Gate) refuse(w http.ResponseWriter, label string, p Problem, extra http.Header) {
	writeProblem(w, p, extra)
	g.metrics.refused(label, p.Reason)
}

// scopeOf names a route's records: the API, the route label ("|" escaped,
// since the first "|" splits off the tenant) and the tenant.
func (g *Gate) scopeOf(label, tenant string) string {
	scope := "http/" + g.api + "/" + strings.ReplaceAll(label, "|", "%7C")
	if tenant != "" {
		scope += "|" + tenant
	}
	return scope
}

// readBody reads the whole request body, up to limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, errBodyTooLarge
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, errBodyTooLarge
	}
	return b, err
}

// Replay implements gatecore.Transport: the stored response, with the
// replay mark and the record's times.
func (c *call) Replay(_ context.Context, s gatecore.Stored) (any, error, bool) {
	if !s.CompletedAt.IsZero() {
		c.header.Set(OriginalTimeHeader, headerTime(s.CompletedAt))
		c.g.metrics.replayed(c.Label, s.CompletedAt)
	}
	if !s.ExpiresAt.IsZero() {
		c.header.Set(ExpiresAtHeader, headerTime(s.ExpiresAt))
	}
	if err := gatecore.TooLarge(s.Outcome); err != nil {
		return nil, err, false
	}
	resp := &idemgatev1.HttpResponse{}
	if s.Outcome.MessageName() != httpResponseName {
		return nil, grpcerr.New(codes.Internal, idemgate.ReasonOutcomeTypeMismatch,
			fmt.Sprintf("the stored outcome is a %s, not an HTTP response; the request was not run again", s.Outcome.MessageName()), nil, 0), false
	}
	if err := proto.Unmarshal(s.Outcome.GetValue(), resp); err != nil {
		return nil, grpcerr.New(codes.Internal, idemgate.ReasonOutcomeTypeMismatch,
			fmt.Sprintf("the stored HTTP response does not decode: %v; the request was not run again", err), nil, 0), false
	}
	c.header.Set(ReplayedHeader, "true")
	return &answer{resp: resp, gate: c.header, rule: c.g.opts.perCaller}, nil, true
}

var httpResponseName = (&idemgatev1.HttpResponse{}).ProtoReflect().Descriptor().FullName()

// Committed implements gatecore.Transport: the caller learns until when
// the outcome is replayed.
func (c *call) Committed(_ context.Context, expiresAt time.Time) {
	c.header.Set(ExpiresAtHeader, headerTime(expiresAt))
}

// Run implements gatecore.Transport: the handler, on the attempt's context
// and a fresh reader of the body, its response captured, and what that
// response means: the handler's mark (MarkFinal, MarkRetryable,
// MarkOutcomeUnknown) when it set one; else a status below 400 is the
// outcome; a 4xx or 5xx is the outcome when the policy replays it, else
// released, or unknown when the handler's context had ended (its execution
// timeout ran out, or it was fenced), since it may have stopped mid-way.
func (c *call) Run(ctx context.Context, _ *gatecore.Attempt) gatecore.Ran {
	rec := newRecorder()
	req := c.r.WithContext(ctx)
	req.Body = io.NopCloser(bytes.NewReader(c.body))
	req.ContentLength = int64(len(c.body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(c.body)), nil }
	c.next.ServeHTTP(rec, req)
	status := rec.statusCode()
	resp := &idemgatev1.HttpResponse{Status: int32(status), Headers: storedHeaders(rec.header, c.g.opts.perCaller), Body: rec.body.Bytes()}
	ans := &answer{resp: resp, gate: c.header, perCaller: perCaller(rec.header, c.g.opts.perCaller), rule: c.g.opts.perCaller}
	verdict := rec.mark
	if verdict == 0 {
		p := c.route.policy
		switch {
		case status < 400, status < 500 && p.ReplayClientErrors, status >= 500 && p.ReplayServerErrors:
			verdict = gatecore.VerdictOutcome
		case ctx.Err() != nil:
			verdict = gatecore.VerdictUnknown
		default:
			verdict = gatecore.VerdictNotRun
		}
	}
	c.verdict = verdict
	switch verdict {
	case gatecore.VerdictOutcome:
		outcome, err := gatecore.MarshalAny(resp)
		if err != nil {
			return gatecore.Ran{Verdict: gatecore.VerdictLost, Answer: ans, Why: "could not serialize the response to store it", Attrs: []slog.Attr{slog.Any("error", err)}}
		}
		return gatecore.Ran{Verdict: verdict, Outcome: outcome, Answer: ans}
	case gatecore.VerdictUnknown:
		return gatecore.Ran{Verdict: verdict, Answer: ans, Code: fmt.Sprintf("HTTP status %d", status), Message: http.StatusText(status)}
	default:
		return gatecore.Ran{Verdict: gatecore.VerdictNotRun, Answer: ans}
	}
}

// headerTime spells a time as the gate's time headers carry it.
func headerTime(t time.Time) string { return gatecore.HeaderTime(t) }

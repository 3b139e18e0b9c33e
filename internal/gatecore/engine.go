package gatecore

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/keys"
)

// Options configure an Engine. A zero field takes the default named.
type Options struct {
	// Logger logs what the caller does not see. Defaults to slog.Default().
	Logger *slog.Logger
	// DedupeTimeout bounds each Begin (plus the call's MaxWait) and Resolve.
	// Defaults to 5s.
	DedupeTimeout time.Duration
	// OutcomeTimeout bounds each Finish or Release attempt. Defaults to 5s.
	OutcomeTimeout time.Duration
	// FinishBudget bounds the background retries of a settlement and of a
	// lost Begin's follow-up (its release included), from the last loss.
	// Defaults to 1m.
	FinishBudget time.Duration
	// InFlightRetry is the RetryInfo delay of IDEMPOTENCY_IN_FLIGHT.
	// Defaults to 1s.
	InFlightRetry time.Duration
	// StoreRetry is the RetryInfo delay of IDEMPOTENCY_STORE_UNAVAILABLE.
	// Defaults to 1s.
	StoreRetry time.Duration
	// MaxOutcome is the largest outcome stored; a larger one is stored as a
	// ResultTooLarge marker. Defaults to 1 MiB.
	MaxOutcome int
	// OnEvent, when set, is told every event with its call's label (for
	// metrics). Defaults to none.
	OnEvent func(label, event string)
	// OnStage, when set, is told how long each stage of a call took, with
	// its call's label (for a latency budget): StagePrepare (from the front
	// end's arrival time to Begin), StageBegin, StageHandler and
	// StageFinish. Defaults to none.
	OnStage func(label, stage string, d time.Duration)
	// ReplayCache, when set, answers a duplicate whose outcome this process
	// stored or replayed without a Dedupe call (Gate). Defaults to none.
	ReplayCache *ReplayCache
	// TypeURLOf names the type of an outcome in the ResultTooLarge marker.
	// Defaults to the outcome's type URL.
	TypeURLOf func(*anypb.Any) string
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	setDefault(&o.DedupeTimeout, 5*time.Second)
	setDefault(&o.OutcomeTimeout, 5*time.Second)
	setDefault(&o.FinishBudget, time.Minute)
	setDefault(&o.InFlightRetry, time.Second)
	setDefault(&o.StoreRetry, time.Second)
	if o.TypeURLOf == nil {
		o.TypeURLOf = (*anypb.Any).GetTypeUrl
	}
	if o.MaxOutcome == 0 {
		o.MaxOutcome = 1 << 20
	}
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d == 0 {
		*d = v
	}
}

// Engine runs gated calls against one Dedupe service. It is safe for
// concurrent use.
type Engine struct {
	dedupe idemgatev1.DedupeServiceClient
	opts   Options
	counts counters
	// background tracks settlements retried after their caller got its
	// answer, and re-sent Begins whose first answer was lost.
	background sync.WaitGroup
	// backgroundMu guards closing: once Close begins nothing new joins
	// background, as a WaitGroup must not grow while Close waits on it.
	backgroundMu sync.Mutex
	closing      bool
	// stopBackground ends the background work, and the retries callers
	// make once Close began, when Close's context ends; backgroundCtx is
	// what that work runs under.
	backgroundCtx  context.Context
	stopBackground context.CancelFunc
	// followUps are the lost Begins still to be re-sent.
	followUps followUps
}

// New returns an Engine on dedupe.
func New(dedupe idemgatev1.DedupeServiceClient, opts Options) *Engine {
	opts.defaults()
	ctx, stop := context.WithCancel(context.Background())
	return &Engine{dedupe: dedupe, opts: opts, backgroundCtx: ctx, stopBackground: stop,
		followUps: followUps{wake: make(chan struct{}, 1)}}
}

// Close waits until every settlement still retried in the background, and
// every lost Begin's follow-up, is settled or given up. When ctx ends first
// it stops them (each is logged and counted as given up), waits for them to
// return, and returns ctx's error. Once Close began nothing joins the
// background: a Begin lost from then on is logged, not followed up, and a
// settlement begun from then on is retried by its caller before its answer,
// within the budget, for as long as ctx lasts, also after Close returned
// nil. So with the usual `ctx, cancel := context.WithTimeout(...); defer
// cancel()` those retries stop as soon as Close returns: stop the servers
// whose handlers settle first, or give Close a ctx that outlives them.
func (e *Engine) Close(ctx context.Context) error {
	e.backgroundMu.Lock()
	e.closing = true
	e.backgroundMu.Unlock()
	done := make(chan struct{})
	go func() { e.background.Wait(); close(done) }()
	select {
	case <-done:
		// Settlements retried by their callers stop when ctx ends, not
		// because the background is done.
		context.AfterFunc(ctx, e.stopBackground)
		return nil
	case <-ctx.Done():
		e.stopBackground()
		<-done
		return ctx.Err()
	}
}

// startBackground registers work that Close waits for, and reports false
// once Close has begun: then nothing new may start in the background (the
// caller does the work itself, or gives it up).
func (e *Engine) startBackground() bool {
	e.backgroundMu.Lock()
	defer e.backgroundMu.Unlock()
	if e.closing {
		return false
	}
	e.background.Add(1)
	return true
}

// Policy is what the Engine needs of a gated operation's policy.
type Policy struct {
	// Lease is how long a reservation is held without a heartbeat.
	Lease time.Duration
	// MaxWait is how long a duplicate waits for an in-flight outcome.
	MaxWait time.Duration
	// OnLostOutcome says what a call finds after an attempt lost its lease.
	OnLostOutcome idemgatev1.LostOutcomePolicy
	// ExecutionTimeout is the handler's deadline.
	ExecutionTimeout time.Duration
	// FinishAfterReply answers the caller before its outcome is stored
	// (FINISH_POLICY_AFTER_REPLY) and stores it right after.
	FinishAfterReply bool
}

// Call is one gated call's identity in the Dedupe service.
type Call struct {
	// Label names the operation in events (the gRPC method, the MCP tool).
	Label string
	// Scope, Key and Token name the record and this attempt.
	Scope, Key, Token string
	// Policy is the operation's policy.
	Policy Policy
	// Retention is how long the record is kept once completed.
	Retention time.Duration
	// Agent is the end caller the gate serves (its tenant), named to the
	// Dedupe service on Begin and Finish (keys.AgentHeader) so a service
	// that trusts this tool server applies its rates per agent. Empty sends
	// nothing.
	Agent string
	// BeginRequest is the call's Begin.
	BeginRequest *idemgatev1.BeginRequest
	// Reconcile, when set, is asked what happened to an earlier attempt's
	// lost outcome (Gate), before the call is refused
	// IDEMPOTENCY_OUTCOME_UNKNOWN.
	Reconcile func(ctx context.Context) (Resolution, error)
	// Stored, when set, is told every outcome the service took for this
	// call and when its first Finish was sent (of any retries, the earliest
	// that may have stored it): this process's estimate of when it was
	// stored, never later, so the record expires Retention after that or
	// later.
	Stored func(outcome *anypb.Any, sent time.Time)
}

// withAgent is ctx naming c's agent to the Dedupe service.
func (c *Call) withAgent(ctx context.Context) context.Context {
	if c.Agent == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, keys.AgentHeader, c.Agent)
}

// NewCall returns the call that reserves key in scope for a request with
// fingerprint, kept retention once completed.
func NewCall(label, scope, key string, fingerprint []byte, p Policy, retention time.Duration) *Call {
	c := &Call{Label: label, Scope: scope, Key: key, Token: rand.Text(), Policy: p, Retention: retention}
	c.BeginRequest = &idemgatev1.BeginRequest{
		Scope:         scope,
		Key:           key,
		Fingerprint:   fingerprint,
		AttemptToken:  c.Token,
		Lease:         durationpb.New(p.Lease),
		Retention:     durationpb.New(retention),
		OnLostOutcome: p.OnLostOutcome,
		MaxWait:       durationpb.New(p.MaxWait),
	}
	return c
}

// Kind is what Begin found.
type Kind int

const (
	// Reserved: this call holds the key; run the handler (Start).
	Reserved Kind = iota + 1
	// Completed: the key's outcome is stored; replay it.
	Completed
	// Unknown: an earlier attempt's outcome was lost (FAIL_CLOSED); the
	// error is IDEMPOTENCY_OUTCOME_UNKNOWN unless a reconciler settles it.
	Unknown
)

// Begun is Begin's answer.
type Begun struct {
	Kind Kind
	// Epoch of the reservation (Reserved).
	Epoch int64
	// BeginTook is how long Begin took to answer (Reserved): a reservation
	// made early in a slow Begin has used that much of its lease.
	BeginTook time.Duration
	// Outcome, CompletedAt and ExpiresAt of the stored record (Completed);
	// a time the service did not send is zero.
	Outcome                *anypb.Any
	CompletedAt, ExpiresAt time.Time
}

// Begin reserves the call's key. It returns Reserved, Completed or Unknown
// (with the IDEMPOTENCY_OUTCOME_UNKNOWN error), or the error to refuse the
// call with: IDEMPOTENCY_IN_FLIGHT, IDEMPOTENCY_KEY_REUSED, or the Dedupe
// service's failure mapped (a lost answer is followed up in the background).
func (e *Engine) Begin(ctx context.Context, c *Call) (Begun, error) {
	beginCtx, cancel := context.WithTimeout(c.withAgent(ctx), e.opts.DedupeTimeout+c.Policy.MaxWait)
	sent := time.Now()
	begun, err := e.dedupe.Begin(beginCtx, c.BeginRequest)
	cancel()
	e.Stage(c, StageBegin, time.Since(sent))
	if err != nil {
		if !refused(err) && !reservedNothing(err) {
			// The reservation may have been made and only its answer lost:
			// make sure it does not outlive this call.
			e.followUpLostBegin(ctx, c, sent)
		}
		return Begun{}, e.BeginError(ctx, err)
	}
	// The service answers: lost Begins waiting out a backoff go now.
	e.wakeFollowUp()
	switch result := begun.GetResult().(type) {
	case *idemgatev1.BeginResponse_Reserved_:
		return Begun{Kind: Reserved, Epoch: result.Reserved.GetEpoch(), BeginTook: time.Since(sent)}, nil
	case *idemgatev1.BeginResponse_Completed_:
		return Begun{Kind: Completed, Outcome: result.Completed.GetOutcome(),
			CompletedAt: timeOf(result.Completed.GetCompletedAt()), ExpiresAt: timeOf(result.Completed.GetExpiresAt())}, nil
	case *idemgatev1.BeginResponse_InFlight_:
		return Begun{}, grpcerr.New(codes.Aborted, idemgate.ReasonInFlight,
			"another call with this idempotency key is still running; retry with the same key to get its outcome",
			nil, e.opts.InFlightRetry)
	case *idemgatev1.BeginResponse_FingerprintMismatch_:
		return Begun{}, grpcerr.New(codes.FailedPrecondition, idemgate.ReasonKeyReused,
			"this idempotency key was first used with a different request; use a new key for a new action",
			nil, 0)
	case *idemgatev1.BeginResponse_OutcomeUnknown_:
		if e.lostBeginHolds(c.Scope, c.Key) {
			// This Gate lost a Begin of the key whose follow-up has not yet
			// got through: that attempt's handler never ran, and its
			// follow-up (now first in line) takes the record back and
			// releases it.
			return Begun{}, grpcerr.New(codes.Aborted, idemgate.ReasonInFlight,
				"an earlier call with this idempotency key reserved it but never ran (its reservation's answer was lost), and this server is releasing it; retry with the same key",
				nil, e.opts.InFlightRetry)
		}
		return Begun{Kind: Unknown}, OutcomeUnknown(c.Key)
	default:
		return Begun{}, grpcerr.New(codes.Internal, idemgate.ReasonStoreRejected,
			fmt.Sprintf("the Dedupe service answered Begin with an unknown result %T", result), nil, 0)
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

// OutcomeUnknown is the refusal of a call whose key's outcome was lost. The
// store cannot tell a holder that died from an attempt whose reservation's
// answer was lost before its handler ran, so the text names every way the
// record is settled: resolved, released by that attempt's follow-up, or
// swept after the unknown retention.
func OutcomeUnknown(key string) error {
	return grpcerr.New(codes.FailedPrecondition, idemgate.ReasonOutcomeUnknown,
		"an earlier attempt with this idempotency key stopped before its outcome was stored, so its side effect may or may not have happened; "+
			"the key is refused until its record is settled: resolved (idemctl, the Dedupe service's Resolve, or the tool's reconciler), "+
			"released by that attempt's tool server if the attempt never ran (its reservation's answer was lost), "+
			"or deleted unresolved after the Dedupe service's unknown retention; escalate it, and do not send the action again under a new key",
		map[string]string{"key": key}, 0)
}

// HandlerOutcomeUnknown is what the caller of a FAIL_CLOSED handler that
// could not tell whether its side effect happened gets: the same answer its
// retries will get. code names the handler's error code.
func HandlerOutcomeUnknown(key, code, message string) error {
	return grpcerr.New(codes.FailedPrecondition, idemgate.ReasonOutcomeUnknown,
		fmt.Sprintf("the handler ended with %s (%s), which leaves its side effect's outcome unknown; the record is marked outcome-unknown "+
			"and the key is refused until the record is resolved (idemctl, the Dedupe service's Resolve, or the tool's reconciler) "+
			"or deleted unresolved after the Dedupe service's unknown retention", code, message),
		map[string]string{"key": key}, 0)
}

// AnswerFenced is the answer for the caller of a holder whose outcome the
// store refused because another attempt took the key over (REEXECUTE) or an
// operator settled it: IDEMPOTENCY_IN_FLIGHT, so its retry gets the outcome
// the store holds.
func (e *Engine) AnswerFenced() error {
	return grpcerr.New(codes.Aborted, idemgate.ReasonInFlight,
		"this attempt lost its reservation to another attempt before its outcome was stored, so its response is not the action's outcome; "+
			"retry with the same key to get the outcome that was stored",
		nil, e.opts.InFlightRetry)
}

// AnswerUnstored is the answer for the caller of a holder whose outcome the
// Dedupe service did not take within a lease of retries (less when the
// finish retry budget or the caller's deadline ends first), or rejected for
// good: it is never answered with an outcome the key may not keep.
// IDEMPOTENCY_IN_FLIGHT, as the key stays held while the retries go on in
// the background: its retry gets the outcome once stored, or what the
// key's on_lost_outcome policy gives if it never is.
func (e *Engine) AnswerUnstored() error {
	return grpcerr.New(codes.Aborted, idemgate.ReasonInFlight,
		"the call ran, but its outcome was not stored, so it is not answered with a response duplicates might never see; "+
			"retry with the same key to get what the key keeps",
		nil, e.opts.InFlightRetry)
}

// Resolve settles an outcome-unknown record with a reconciler's answer. A
// record already settled or gone counts as settled: the next Begin replays
// or reserves. It counts the reconciliation.
func (e *Engine) Resolve(ctx context.Context, c *Call, req *idemgatev1.ResolveRequest) error {
	resolveCtx, cancel := context.WithTimeout(ctx, e.opts.DedupeTimeout)
	defer cancel()
	if _, err := e.dedupe.Resolve(resolveCtx, req); err != nil {
		if code := status.Code(err); code != codes.FailedPrecondition && code != codes.NotFound {
			return e.BeginError(ctx, err)
		}
	}
	e.Event(c, EventReconciled)
	return nil
}

// BeginError maps a failed Dedupe call before the handler ran. The caller's
// own cancellation stays what it is; a Dedupe service that is down or
// overloaded fails closed as UNAVAILABLE; one that refused the request is a
// misconfiguration, INTERNAL.
func (e *Engine) BeginError(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return status.FromContextError(ctxErr).Err()
	}
	switch status.Code(err) {
	case codes.ResourceExhausted:
		retry, _ := grpcerr.RetryDelay(err)
		return grpcerr.New(codes.ResourceExhausted, idemgate.ReasonQuotaExceeded,
			"this tool server is over its quota at the Dedupe service ("+status.Convert(err).Message()+"); the handler did not run",
			map[string]string{"quota": quotaOf(err)}, retry)
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented, codes.OutOfRange:
		return grpcerr.New(codes.Internal, idemgate.ReasonStoreRejected,
			"the Dedupe service refused the reservation: "+status.Convert(err).Message()+"; the handler did not run", nil, 0)
	case codes.Internal:
		if grpcerr.Reason(err) == reasonDedupeOutcomeUnreadable {
			return grpcerr.New(codes.Internal, idemgate.ReasonStoreRejected,
				"the Dedupe service holds this action's outcome but cannot read it ("+status.Convert(err).Message()+"); the handler did not run, and will not until an operator restores the outcome key", nil, 0)
		}
		return grpcerr.New(codes.Unavailable, idemgate.ReasonStoreUnavailable,
			"the Dedupe service failed, so the call was not run (fail closed); retry with the same idempotency key",
			nil, e.opts.StoreRetry)
	default:
		return grpcerr.New(codes.Unavailable, idemgate.ReasonStoreUnavailable,
			"the Dedupe service is unavailable, so the call was not run (fail closed); retry with the same idempotency key",
			nil, e.opts.StoreRetry)
	}
}

func quotaOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetMetadata()["quota"]
		}
	}
	return ""
}

// refused reports whether a Begin error is the Dedupe service's definite
// refusal, so no reservation can have been made.
func refused(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented, codes.OutOfRange,
		codes.ResourceExhausted:
		return true
	case codes.Internal:
		return grpcerr.Reason(err) == reasonDedupeOutcomeUnreadable
	}
	return false
}

// reservedNothing reports whether err is the Dedupe service's answer that
// the Begin reserved nothing: its store failed before it sent any of it,
// on the call's first try (ErrorInfo metadata "reserved": "none"). Such a
// Begin leaves nothing to follow up, so a store outage that refuses every
// try does not fill the follow-ups' queue with them, which crowded out
// Begins that did reserve (issue 38 item 2).
func reservedNothing(err error) bool {
	return status.Code(err) == codes.Unavailable && grpcerr.Reason(err) == reasonDedupeStoreUnavailable &&
		grpcerr.Metadata(err)[metadataReserved] == reservedNone
}

// TooLargeName is the full name of the marker stored in place of an outcome
// that was not stored: over the size limit, or over its caller's
// stored-bytes quota.
var TooLargeName = (&idemgatev1.ResultTooLarge{}).ProtoReflect().Descriptor().FullName()

// TooLarge returns the IDEMPOTENCY_RESULT_TOO_LARGE refusal when a stored
// outcome is the ResultTooLarge marker, else nil. The reason is the same
// for either cause; the message and the ErrorInfo metadata "cause"
// (TooLargeCause) say which it was.
func TooLarge(outcome *anypb.Any) error {
	if outcome.MessageName() != TooLargeName {
		return nil
	}
	marker := &idemgatev1.ResultTooLarge{}
	_ = proto.Unmarshal(outcome.GetValue(), marker)
	msg := "this action already ran, but its outcome (%d bytes) was over the size limit and was not stored, so it cannot be replayed; the call was not run again"
	if cause := TooLargeCause(marker); cause == "stored_bytes_quota" {
		msg = "this action already ran, but its outcome (%d bytes), within the size limit, was not stored: it would have taken this server over its stored-outcome quota on the Dedupe service (-caller-max-bytes). It cannot be replayed; the call was not run again"
	}
	return grpcerr.New(codes.FailedPrecondition, idemgate.ReasonResultTooLarge, fmt.Sprintf(msg, marker.GetSizeBytes()),
		map[string]string{"size_bytes": strconv.FormatInt(marker.GetSizeBytes(), 10), "cause": TooLargeCause(marker)}, 0)
}

// TooLargeCause names why marker's outcome was not stored, as the
// IDEMPOTENCY_RESULT_TOO_LARGE ErrorInfo metadata "cause" says it:
// "stored_bytes_quota", or "size_limit" (also for a marker written before
// the cause was recorded, and for a cause this version does not know).
func TooLargeCause(marker *idemgatev1.ResultTooLarge) string {
	if marker.GetCause() == idemgatev1.ResultTooLargeCause_RESULT_TOO_LARGE_CAUSE_STORED_BYTES_QUOTA {
		return "stored_bytes_quota"
	}
	return "size_limit"
}

// MarshalAny packs m deterministically.
func MarshalAny(m proto.Message) (*anypb.Any, error) {
	outcome := &anypb.Any{}
	err := anypb.MarshalFrom(outcome, m, proto.MarshalOptions{Deterministic: true})
	return outcome, err
}

package dedupesvc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/keys"
)

// Request limits the service enforces before it touches the store.
const (
	// MaxScopeBytes is the longest scope accepted.
	MaxScopeBytes = 1024
	// MaxAttemptTokenBytes is the longest attempt token accepted.
	MaxAttemptTokenBytes = 128
	// FingerprintBytes is the length of a fingerprint: a SHA-256 digest.
	FingerprintBytes = 32
	// MinLease is the shortest lease accepted.
	MinLease = time.Second
	// MaxRetention is the longest retention accepted; a retention must also
	// be at least the Begin's lease.
	MaxRetention = 365 * 24 * time.Hour
	// MaxTypeURLBytes is the longest outcome type URL accepted.
	MaxTypeURLBytes = 512
	// MaxWait is the longest a Begin may wait for an in-flight outcome.
	MaxWait = time.Minute
	// MaxLease is the longest lease a Begin may take or a Heartbeat renew to.
	MaxLease = 24 * time.Hour
)

// Server implements idemgatev1.DedupeServiceServer over a Store.
type Server struct {
	idemgatev1.UnimplementedDedupeServiceServer
	store Store
	opts  options
	waits waitCounters
	rates rateLimiters
	// finishes and outcomeBytes limit each caller's Finishes, by count at
	// the Begin rate and by the bytes of their outcomes.
	finishes, outcomeBytes rateLimiters
	keys                   keyWaits
	// finishing is each caller's Finish bytes in flight
	// (AdmitFinishCall), under finishingMu.
	finishingMu sync.Mutex
	finishing   map[string]int
	// begins are the places of Begins at the store
	// (WithMaxConcurrentBegins); nil for no bound.
	begins *semaphore.Weighted
	// storeFailures paces the log of store failures (unavailable).
	storeFailures pacedLog
	// usage lets a Begin far below its caller's quotas skip the store's
	// usage read; nil without quotas or on a store that is no UsageReader.
	usage *usageLedger
}

// pacedLog lets one line through, then at most one a second, counting the
// ones held back: a store that is away fails every call, and a line per
// call (about 1,000 a second per replica in issue 38's outage) buried the
// one that said what failed. Lock-free: every failing call passes here.
type pacedLog struct {
	// next is when, in Unix nanoseconds, the next line may be logged.
	next atomic.Int64
	// held counts the lines held back since the last one logged.
	held atomic.Int64
}

// take reports whether a line may be logged at now and, when it may, how
// many were held back since the last one.
func (l *pacedLog) take(now time.Time) (held int64, ok bool) {
	next := l.next.Load()
	if now.UnixNano() < next || !l.next.CompareAndSwap(next, now.Add(time.Second).UnixNano()) {
		l.held.Add(1)
		return 0, false
	}
	return l.held.Swap(0), true
}

type waitCounters struct {
	started, notified, polled, outcomes atomic.Int64
}

// WaitStats counts how Begins waited for in-flight outcomes.
type WaitStats struct {
	// Started counts Begins that found the key in flight and waited.
	Started int64
	// Notified counts re-reads a notification woke.
	Notified int64
	// Polled counts re-reads the poll timer woke.
	Polled int64
	// Outcomes counts waits that ended with something other than in flight:
	// a replay, a reservation, or an unknown outcome.
	Outcomes int64
}

// WaitStats returns the wait counters since the Server was built.
func (s *Server) WaitStats() WaitStats {
	return WaitStats{Started: s.waits.started.Load(), Notified: s.waits.notified.Load(), Polled: s.waits.polled.Load(), Outcomes: s.waits.outcomes.Load()}
}

// NewServer returns the Dedupe service over store.
func NewServer(store Store, opts ...Option) *Server {
	o := defaultOptions
	for _, opt := range opts {
		opt(&o)
	}
	srv := &Server{store: store, opts: o, finishing: map[string]int{}}
	if reader, ok := store.(UsageReader); ok && (o.callerRecords > 0 || o.callerBytes > 0) {
		srv.usage = newUsageLedger(reader)
	}
	if o.maxBegins > 0 {
		srv.begins = semaphore.NewWeighted(int64(o.maxBegins))
	}
	srv.rates.limit, srv.rates.burst = rate.Limit(o.callerRate), o.callerBurst
	srv.finishes.limit, srv.finishes.burst = rate.Limit(o.callerRate), o.callerBurst
	// Every accepted outcome must fit in a full bucket, or it could never
	// pass.
	srv.outcomeBytes.limit, srv.outcomeBytes.burst = rate.Limit(o.outcomeRate), max(o.outcomeBurst, o.maxOutcome+MaxTypeURLBytes)
	return srv
}

// Begin implements idemgatev1.DedupeServiceServer.
func (s *Server) Begin(ctx context.Context, req *idemgatev1.BeginRequest) (*idemgatev1.BeginResponse, error) {
	defer s.opts.metrics.observe("Begin", time.Now())
	ctx, stages := s.opts.metrics.startStages(ctx)
	resp, err := s.begin(ctx, req)
	s.countBegin(resp, err)
	if c := resp.GetCompleted(); c != nil {
		s.replayed(ctx, req, c)
	}
	s.opts.metrics.observeStages("Begin", stages)
	return resp, err
}

// replayed counts a replay served: per method in the metrics, and per record
// in the replay recorder, which adds it to the record later (Begin itself
// stays read-only on a replay).
func (s *Server) replayed(ctx context.Context, req *idemgatev1.BeginRequest, c *idemgatev1.BeginResponse_Completed) {
	ns, err := namespace(ctx)
	if err != nil {
		return // cannot happen: Begin answered, so the name was valid
	}
	s.opts.metrics.replay(ns, req.GetScope())
	if s.opts.replays == nil {
		return
	}
	s.opts.replays.Record(RecordID{Namespace: ns, Scope: req.GetScope(), Key: req.GetKey()}, c.GetCompletedAt().AsTime())
}

// countBegin counts Begin's answer.
func (s *Server) countBegin(resp *idemgatev1.BeginResponse, err error) {
	m := s.opts.metrics
	switch {
	case err != nil:
		if o := errOutcome(err); o != "" {
			m.count(o)
		}
	case resp.GetReserved() != nil:
		m.count(outcomeReserved)
	case resp.GetCompleted() != nil:
		m.count(outcomeReplayed)
	case resp.GetInFlight() != nil:
		m.count(outcomeInFlight)
	case resp.GetFingerprintMismatch() != nil:
		m.count(outcomeMismatched)
	case resp.GetOutcomeUnknown() != nil:
		m.count(outcomeUnknown)
	}
}

// errOutcome names the outcome a failed RPC counts as.
func errOutcome(err error) string {
	switch grpcerr.Reason(err) {
	case ReasonReservationNotHeld:
		return outcomeFenced
	case ReasonStoreUnavailable:
		return outcomeStoreErrors
	case ReasonInvalidRequest, ReasonOutcomeTooLarge:
		return outcomeInvalid
	default:
		return ""
	}
}

// counted counts an RPC's success as ok, or its failure by reason.
func (s *Server) counted(ok string, err error) {
	if err == nil {
		if ok != "" {
			s.opts.metrics.count(ok)
		}
	} else if o := errOutcome(err); o != "" {
		s.opts.metrics.count(o)
	}
}

func (s *Server) begin(ctx context.Context, req *idemgatev1.BeginRequest) (*idemgatev1.BeginResponse, error) {
	arrived := time.Now() // max_wait counts from here, the first read included
	ns, err := namespace(ctx)
	if err != nil {
		return nil, err
	}
	if err := validateRecordID(req.GetScope(), req.GetKey(), req.GetAttemptToken()); err != nil {
		return nil, err
	}
	if len(req.GetFingerprint()) != FingerprintBytes {
		return nil, invalid("fingerprint", fmt.Sprintf("fingerprint must be a %d-byte SHA-256 digest, got %d bytes", FingerprintBytes, len(req.GetFingerprint())))
	}
	// Bounded like a Heartbeat's renewal: a lease is how long a crashed
	// holder blocks its key, and after a store outage every holder gets one
	// more lease (see pgstore), so it must stay short of the retention scale.
	lease, err := duration("lease", req.GetLease(), MinLease, MaxLease)
	if err != nil {
		return nil, err
	}
	retention, err := duration("retention", req.GetRetention(), lease, MaxRetention)
	if err != nil {
		return nil, err
	}
	if retention > s.opts.maxRetention {
		s.opts.metrics.quota(QuotaRetention)
		return nil, grpcerr.New(codes.InvalidArgument, ReasonInvalidRequest,
			fmt.Sprintf("retention %s is over this service's cap of %s (-max-retention); ask for %s or less", retention, s.opts.maxRetention, s.opts.maxRetention),
			map[string]string{"field": "retention", "max_retention": s.opts.maxRetention.String()}, 0)
	}
	var maxWait time.Duration
	if req.GetMaxWait() != nil {
		if maxWait, err = duration("max_wait", req.GetMaxWait(), 0, MaxWait); err != nil {
			return nil, err
		}
	}
	var onLost LostOutcome
	switch req.GetOnLostOutcome() {
	case idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_UNSPECIFIED, idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED:
		onLost = FailClosed
	case idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_REEXECUTE:
		onLost = Reexecute
	default:
		return nil, invalid("on_lost_outcome", fmt.Sprintf("on_lost_outcome %d is not a LostOutcomePolicy", req.GetOnLostOutcome()))
	}
	params := BeginParams{
		Namespace:        ns,
		Scope:            req.GetScope(),
		Key:              req.GetKey(),
		Fingerprint:      req.GetFingerprint(),
		AttemptToken:     req.GetAttemptToken(),
		Lease:            lease,
		Retention:        retention,
		OnLostOutcome:    onLost,
		UnknownRetention: s.opts.unknownRetention,
		MaxRecords:       s.opts.callerRecords,
		MaxOutcomeBytes:  s.opts.callerBytes,
		ResolveOnly:      s.opts.resolveOnly,
	}
	// Last of the checks, so a malformed request spends no token. While the
	// caller's Finishes would be refused for their bytes (AdmitFinish), a
	// Begin is refused too, spending nothing: a handler let run now might
	// not get its outcome stored within the interceptor's finish budget,
	// which would lose it (or, under REEXECUTE, run it again).
	if err := s.outcomeRoom(ns, "its Begins are refused, so no handler runs whose outcome could not be stored,"); err != nil {
		return nil, err
	}
	if wait, ok := s.rates.allow(rateKey(ctx, ns), 1); !ok {
		s.opts.metrics.quota(QuotaRate)
		return nil, quotaExceeded(QuotaRate, formatRate(s.rates.limit),
			fmt.Sprintf("this caller is over its rate of %s Begins a second (-caller-begin-rate); retry after the delay", formatRate(s.rates.limit)), wait)
	}
	leave, err := s.admitBegin(ctx)
	if err != nil {
		return nil, err
	}
	stages := StageTimerFrom(ctx)
	stages.storeStarted()
	params, counted, err := s.usage.admit(ctx, params)
	var res BeginResult
	if err == nil {
		res, err = s.store.Begin(ctx, params)
		counted(err == nil && res.State == BeginReserved)
	}
	stages.storeEnded()
	leave()
	if err == nil && res.State == BeginInFlight && maxWait > 0 {
		// Its re-reads are the wait stage, not statements of this call's
		// store stage, which ended.
		res, err = s.wait(WithStageTimer(ctx, nil), params, res, arrived.Add(maxWait))
		stages.waitEnded()
	}
	if err != nil {
		if errors.Is(err, ErrNotSent) && ctx.Err() == nil && firstTry(ctx) {
			return nil, s.unavailable(ctx, "Begin", err, map[string]string{MetadataReserved: ReservedNone})
		}
		return nil, s.storeError(ctx, "Begin", err)
	}
	switch res.State {
	case BeginReserved:
		return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_Reserved_{Reserved: &idemgatev1.BeginResponse_Reserved{
			Epoch:          res.Epoch,
			LeaseExpiresAt: timestamppb.New(res.LeaseExpiresAt),
		}}}, nil
	case BeginCompleted:
		value, err := s.openOutcome(ctx, params.ID(), res.Outcome)
		if err != nil {
			return nil, err
		}
		return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_Completed_{Completed: &idemgatev1.BeginResponse_Completed{
			Outcome:     &anypb.Any{TypeUrl: res.Outcome.TypeURL, Value: value},
			CompletedAt: timestamppb.New(res.CompletedAt),
			ExpiresAt:   timestamppb.New(res.ExpiresAt),
		}}}, nil
	case BeginInFlight:
		return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_InFlight_{InFlight: &idemgatev1.BeginResponse_InFlight{
			LeaseExpiresAt: timestamppb.New(res.LeaseExpiresAt),
		}}}, nil
	case BeginFingerprintMismatch:
		return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_FingerprintMismatch_{FingerprintMismatch: &idemgatev1.BeginResponse_FingerprintMismatch{}}}, nil
	case BeginOutcomeUnknown:
		return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_OutcomeUnknown_{OutcomeUnknown: &idemgatev1.BeginResponse_OutcomeUnknown{
			Epoch:          res.Epoch,
			LeaseExpiredAt: timestamppb.New(res.LeaseExpiresAt),
		}}}, nil
	default:
		return nil, status.Errorf(codes.Internal, "dedupesvc: store answered Begin with unknown state %d", res.State)
	}
}

// Finish implements idemgatev1.DedupeServiceServer.
func (s *Server) Finish(ctx context.Context, req *idemgatev1.FinishRequest) (*idemgatev1.FinishResponse, error) {
	defer s.opts.metrics.observe("Finish", time.Now())
	ctx, stages := s.opts.metrics.startStages(ctx)
	resp, err := s.finish(ctx, req)
	s.counted(outcomeFinished, err)
	s.opts.metrics.observeStages("Finish", stages)
	return resp, err
}

func (s *Server) finish(ctx context.Context, req *idemgatev1.FinishRequest) (*idemgatev1.FinishResponse, error) {
	ns, err := namespace(ctx)
	if err != nil {
		return nil, err
	}
	if err := validateRecordID(req.GetScope(), req.GetKey(), req.GetAttemptToken()); err != nil {
		return nil, err
	}
	if req.GetEpoch() <= 0 {
		return nil, invalid("epoch", "epoch must be the positive epoch Begin answered")
	}
	outcome, err := s.validOutcome("outcome", req.GetOutcome())
	if err != nil {
		return nil, err
	}
	// The rates are checked before anything costs: the store, the cipher.
	if err := s.allowFinish(ctx, ns, len(outcome.TypeURL)+len(outcome.Value)); err != nil {
		return nil, err
	}
	id := RecordID{Namespace: ns, Scope: req.GetScope(), Key: req.GetKey()}
	params := FinishParams{
		Namespace:       ns,
		Scope:           req.GetScope(),
		Key:             req.GetKey(),
		AttemptToken:    req.GetAttemptToken(),
		Epoch:           req.GetEpoch(),
		MaxOutcomeBytes: s.opts.callerBytes,
		ResolveOnly:     s.opts.resolveOnly,
	}
	stages := StageTimerFrom(ctx)
	if checker, ok := s.store.(FinishChecker); ok && len(outcome.Value) >= FinishCheckBytes {
		// A large outcome goes to the store only for an attempt that holds
		// its key: a Finish for a key never reserved costs one short read.
		stages.storeStarted()
		done, err := checker.CheckFinish(ctx, params)
		stages.storeEnded()
		if err != nil {
			return nil, s.finishError(ctx, params, err)
		}
		if done {
			return &idemgatev1.FinishResponse{}, nil
		}
	}
	plain := outcome
	if params.Outcome, err = s.sealOutcome(id, outcome); err != nil {
		return nil, err
	}
	if params.MaxOutcomeBytes > 0 {
		marker, err := s.overQuotaMarker(id, plain)
		if err != nil {
			return nil, err
		}
		params.OverQuota = &marker
	}
	stages.storeStarted()
	replaced := false
	if qf, ok := s.store.(QuotaFinisher); ok {
		replaced, err = qf.FinishWithinQuota(ctx, params)
	} else {
		err = s.store.Finish(ctx, params)
	}
	stages.storeEnded()
	if err != nil {
		return nil, s.finishError(ctx, params, err)
	}
	if !replaced {
		s.usage.storedBytes(ns, len(params.Outcome.Value))
	}
	if replaced {
		s.opts.metrics.quota(QuotaBytes)
		s.opts.logger.WarnContext(ctx, "an outcome would have taken its caller over its stored-bytes quota (-caller-max-bytes): a ResultTooLarge marker is stored in its place; the holder's caller got its response, duplicates get IDEMPOTENCY_RESULT_TOO_LARGE (cause stored_bytes_quota) and nothing runs again",
			slog.String("namespace", ns), slog.String("scope", params.Scope), slog.String("key", params.Key),
			slog.Int("bytes", len(params.Outcome.Value)), slog.Int64("quota", params.MaxOutcomeBytes))
	}
	return &idemgatev1.FinishResponse{OutcomeReplaced: replaced}, nil
}

// FinishCheckBytes is the outcome size from which Finish first asks a
// FinishChecker store whether the attempt holds its key: 64 KiB, where
// sending the outcome costs the store more than the extra short read.
const FinishCheckBytes = 64 << 10

// allowFinish takes a Finish's tokens from its caller's buckets: one Finish
// and size outcome bytes. The Finish bucket is the Begin bucket's twin, per
// forwarded agent too (the gate names the agent on Finish as on Begin), so
// Finishes that follow Begins let in pass; the outcome bytes stay the tool
// server's. A refused Finish spends nothing: the Finish bucket is only
// looked at until the bytes are taken, and the bytes go back if the Finish
// token went to a concurrent Finish meanwhile (rare: holds said it was there).
//
// A Finish whose size its gate declared had those bytes taken as it arrived
// (AdmitFinishCall): they pay for it, and an outcome larger than declared
// is refused INVALID_ARGUMENT (DEDUPE_REQUEST_INVALID, field outcome).
func (s *Server) allowFinish(ctx context.Context, ns string, size int) error {
	key := rateKey(ctx, ns)
	if wait, ok := s.finishes.holds(key, 1); !ok {
		return s.finishRateExceeded(wait)
	}
	var (
		refund func()
		wait   time.Duration
		ok     bool
	)
	if g, _ := ctx.Value(finishGrantKey{}).(*finishGrant); g != nil && g.declared >= 0 {
		if size > g.declared {
			return invalid("outcome", fmt.Sprintf("the outcome is %d bytes, more than the %d its gate declared in %s", size, g.declared, OutcomeBytesHeader))
		}
		refund, ok = g.refund, true
	} else {
		refund, wait, ok = s.outcomeBytes.take(ns, size)
	}
	if !ok {
		s.opts.metrics.quota(QuotaRate)
		return quotaExceeded(QuotaRate, formatRate(s.outcomeBytes.limit)+" bytes",
			fmt.Sprintf("this caller is over its rate of %s outcome bytes a second (-caller-outcome-byte-rate); retry after the delay", formatRate(s.outcomeBytes.limit)), wait)
	}
	if wait, ok := s.finishes.allow(key, 1); !ok {
		refund()
		return s.finishRateExceeded(wait)
	}
	return nil
}

// finishRateExceeded counts and returns the refusal of a Finish over its
// caller's Finish rate, free again after wait.
func (s *Server) finishRateExceeded(wait time.Duration) error {
	s.opts.metrics.quota(QuotaRate)
	return quotaExceeded(QuotaRate, formatRate(s.finishes.limit),
		fmt.Sprintf("this caller is over its rate of %s Finishes a second (-caller-begin-rate, which limits Begins and Finishes alike); retry after the delay", formatRate(s.finishes.limit)), wait)
}

// AdmitFinish is the check a Finish of caller (its namespace) meets as it
// arrives, before its request is read (cmd/dedupesvc installs it as the
// gRPC InTapHandle): while the caller's outcome-byte bucket
// (WithCallerOutcomeRate) holds less than the largest outcome
// (WithMaxOutcomeBytes), it returns RESOURCE_EXHAUSTED DEDUPE_QUOTA_EXCEEDED
// (quota rate) with RetryInfo, and the request's bytes are never read. A
// caller that keeps sending Finishes past its byte rate, ignoring RetryInfo,
// then costs the service their headers, not their megabytes. A caller that
// stays under its rate by more than one outcome a second never meets it:
// its bucket stays above one outcome. It takes no tokens: Finish charges
// the outcome's real size. Refusals here are counted in
// idemgate_dedupe_quota_exceeded_total, not in grpc_server_handled_total
// (no handler runs).
func (s *Server) AdmitFinish(caller string) error {
	return s.outcomeRoom(caller, "its Finishes are refused as they arrive")
}

// OutcomeBytesHeader is the metadata key in which a gate declares the size
// of a Finish's outcome (type URL plus value bytes, in decimal), so that
// AdmitFinishCall can charge it before the message is read. Optional: a
// Finish without it (older gates) is admitted as AdmitFinish admits it.
const OutcomeBytesHeader = keys.OutcomeBytesHeader

// finishGrantKey keys the context value AdmitFinishCall leaves for Finish.
type finishGrantKey struct{}

// finishGrant is what a Finish was granted as it arrived: declared outcome
// bytes (-1: none declared) taken from its caller's bucket, given back by
// refund.
type finishGrant struct {
	declared int
	refund   func()
}

// AdmitFinishCall is the check a Finish of caller (its namespace) meets as
// it arrives, before its request is read (cmd/dedupesvc installs it in the
// gRPC InTapHandle, whose ctx ends with the call); declared is the outcome
// size its gate sent in OutcomeBytesHeader, or -1 when it sent none. It
// refuses RESOURCE_EXHAUSTED, DEDUPE_QUOTA_EXCEEDED, with RetryInfo:
//   - (quota finish_bytes_in_flight) when the caller's Finishes in flight
//     hold WithMaxFinishBytesInFlight already, each counted at its declared
//     size, or at the largest outcome (WithMaxOutcomeBytes) when undeclared;
//   - (quota rate) when the caller's outcome-byte bucket
//     (WithCallerOutcomeRate) cannot give the declared size, which it then
//     takes, so concurrent Finishes cannot all pass one look at the bucket
//     (Finish charges nothing more, and refuses an outcome over its
//     declared size); an undeclared Finish meets AdmitFinish instead.
//
// The returned context carries the grant to Finish, and gives the in-flight
// bytes back when ctx ends.
func (s *Server) AdmitFinishCall(ctx context.Context, caller string, declared int) (context.Context, error) {
	largest := s.opts.maxOutcome + MaxTypeURLBytes
	charge := largest
	if declared >= 0 {
		charge = min(declared, largest)
	}
	release, err := s.holdFinishBytes(caller, charge)
	if err != nil {
		return ctx, err
	}
	var grant *finishGrant
	if declared < 0 {
		err = s.AdmitFinish(caller)
	} else if refund, wait, ok := s.outcomeBytes.take(caller, charge); ok {
		grant = &finishGrant{declared: declared, refund: refund}
	} else {
		s.opts.metrics.quota(QuotaRate)
		err = quotaExceeded(QuotaRate, formatRate(s.outcomeBytes.limit)+" bytes",
			fmt.Sprintf("this caller is over its rate of %s outcome bytes a second (-caller-outcome-byte-rate): its Finish of %d declared bytes is refused as it arrives; retry after the delay", formatRate(s.outcomeBytes.limit), declared), wait)
	}
	if err != nil {
		// grpc-go does not end a stream's context when its tap handle
		// refuses it: given back now.
		release()
		return ctx, err
	}
	context.AfterFunc(ctx, release)
	if grant != nil {
		ctx = context.WithValue(ctx, finishGrantKey{}, grant)
	}
	return ctx, nil
}

// holdFinishBytes adds n to caller's Finish bytes in flight, or refuses
// when they would pass WithMaxFinishBytesInFlight; release gives them back.
func (s *Server) holdFinishBytes(caller string, n int) (release func(), err error) {
	limit := s.opts.finishInFlight
	if limit <= 0 {
		return func() {}, nil
	}
	limit = max(limit, s.opts.maxOutcome+MaxTypeURLBytes)
	s.finishingMu.Lock()
	defer s.finishingMu.Unlock()
	held := s.finishing[caller]
	if held+n > limit {
		s.opts.metrics.quota(QuotaFinishesInFlight)
		return nil, quotaExceeded(QuotaFinishesInFlight, strconv.Itoa(limit),
			fmt.Sprintf("this caller's Finishes in flight hold %d of its %d outcome bytes (-max-finish-bytes-in-flight); retry after the delay", held, limit), 10*time.Millisecond)
	}
	s.finishing[caller] = held + n
	var once sync.Once
	return func() {
		once.Do(func() {
			s.finishingMu.Lock()
			if s.finishing[caller] -= n; s.finishing[caller] <= 0 {
				delete(s.finishing, caller)
			}
			s.finishingMu.Unlock()
		})
	}, nil
}

// outcomeRoom refuses, for its rate, a caller whose outcome byte bucket
// holds less than the largest outcome; refused says what is refused.
func (s *Server) outcomeRoom(caller, refused string) error {
	wait, ok := s.outcomeBytes.holds(caller, s.opts.maxOutcome)
	if ok {
		return nil
	}
	s.opts.metrics.quota(QuotaRate)
	return quotaExceeded(QuotaRate, formatRate(s.outcomeBytes.limit)+" bytes",
		fmt.Sprintf("this caller is over its rate of %s outcome bytes a second (-caller-outcome-byte-rate): %s until it has room for the largest outcome again; retry after the delay", formatRate(s.outcomeBytes.limit), refused), wait)
}

// overQuotaMarker is what Finish stores in place of outcome when it would
// take its caller over the stored-bytes quota: the ResultTooLarge marker an
// interceptor stores for an outcome over the size limit, with the cause
// RESULT_TOO_LARGE_CAUSE_STORED_BYTES_QUOTA, sealed like any outcome, so
// every duplicate gets IDEMPOTENCY_RESULT_TOO_LARGE saying it was the quota,
// and nothing runs twice. An outcome that is such a marker already stays
// itself (its cause is the size limit).
func (s *Server) overQuotaMarker(id RecordID, outcome Outcome) (Outcome, error) {
	if outcome.TypeURL != resultTooLargeURL {
		v, err := proto.MarshalOptions{Deterministic: true}.Marshal(&idemgatev1.ResultTooLarge{SizeBytes: int64(len(outcome.Value)), TypeUrl: outcome.TypeURL,
			Cause: idemgatev1.ResultTooLargeCause_RESULT_TOO_LARGE_CAUSE_STORED_BYTES_QUOTA})
		if err != nil {
			return Outcome{}, status.Errorf(codes.Internal, "dedupesvc: marshal the over-quota marker: %v", err)
		}
		outcome = Outcome{TypeURL: resultTooLargeURL, Value: v}
	}
	return s.sealOutcome(id, outcome)
}

// resultTooLargeURL is the type URL of the ResultTooLarge marker.
var resultTooLargeURL = "type.googleapis.com/" + string((&idemgatev1.ResultTooLarge{}).ProtoReflect().Descriptor().FullName())

// finishError is storeError for Finish; a late Finish refused because its
// record was marked outcome-unknown, under WithResolveOnlySettlesUnknown, is
// logged, since its outcome is not stored and an operator resolves the key.
func (s *Server) finishError(ctx context.Context, p FinishParams, err error) error {
	if p.ResolveOnly && errors.Is(err, ErrNotHeld) {
		s.opts.logger.WarnContext(ctx, "a Finish was refused: its attempt no longer holds the record (with -resolve-admin-only, a record marked outcome-unknown is settled only by an operator's Resolve); if the record is outcome-unknown, its attempt did run: resolve it",
			slog.String("namespace", p.Namespace), slog.String("scope", p.Scope), slog.String("key", p.Key), slog.Int64("epoch", p.Epoch))
	}
	return s.storeError(ctx, "Finish", err)
}

// Release implements idemgatev1.DedupeServiceServer.
func (s *Server) Release(ctx context.Context, req *idemgatev1.ReleaseRequest) (*idemgatev1.ReleaseResponse, error) {
	defer s.opts.metrics.observe("Release", time.Now())
	resp, err := s.release(ctx, req)
	s.counted(outcomeReleased, err)
	return resp, err
}

func (s *Server) release(ctx context.Context, req *idemgatev1.ReleaseRequest) (*idemgatev1.ReleaseResponse, error) {
	ns, err := namespace(ctx)
	if err != nil {
		return nil, err
	}
	if err := validateRecordID(req.GetScope(), req.GetKey(), req.GetAttemptToken()); err != nil {
		return nil, err
	}
	if req.GetEpoch() <= 0 {
		return nil, invalid("epoch", "epoch must be the positive epoch Begin answered")
	}
	err = s.store.Release(ctx, ReleaseParams{
		Namespace:    ns,
		Scope:        req.GetScope(),
		Key:          req.GetKey(),
		AttemptToken: req.GetAttemptToken(),
		Epoch:        req.GetEpoch(),
		// The record becomes outcome-unknown at once, kept like one whose
		// FAIL_CLOSED lease ran out.
		OutcomeUnknown:   req.GetOutcomeUnknown(),
		UnknownRetention: s.opts.unknownRetention,
		ResolveOnly:      s.opts.resolveOnly,
	})
	if err != nil {
		return nil, s.storeError(ctx, "Release", err)
	}
	return &idemgatev1.ReleaseResponse{}, nil
}

// Heartbeat implements idemgatev1.DedupeServiceServer.
func (s *Server) Heartbeat(ctx context.Context, req *idemgatev1.HeartbeatRequest) (*idemgatev1.HeartbeatResponse, error) {
	defer s.opts.metrics.observe("Heartbeat", time.Now())
	resp, err := s.heartbeat(ctx, req)
	// The start-up check's probe (keys.ProbeScope) is answered "not held"
	// by a working service: that answer is no fenced holder. Its failures
	// (the store down) count as any other.
	if !(req.GetScope() == keys.ProbeScope && req.GetKey() == keys.ProbeKey && errOutcome(err) == outcomeFenced) {
		s.counted("", err)
	}
	return resp, err
}

func (s *Server) heartbeat(ctx context.Context, req *idemgatev1.HeartbeatRequest) (*idemgatev1.HeartbeatResponse, error) {
	ns, err := namespace(ctx)
	if err != nil {
		return nil, err
	}
	if err := validateRecordID(req.GetScope(), req.GetKey(), req.GetAttemptToken()); err != nil {
		return nil, err
	}
	if req.GetEpoch() <= 0 {
		return nil, invalid("epoch", "epoch must be the positive epoch Begin answered")
	}
	lease, err := duration("lease", req.GetLease(), MinLease, MaxLease)
	if err != nil {
		return nil, err
	}
	until, err := s.store.Heartbeat(ctx, HeartbeatParams{
		Namespace:    ns,
		Scope:        req.GetScope(),
		Key:          req.GetKey(),
		AttemptToken: req.GetAttemptToken(),
		Epoch:        req.GetEpoch(),
		Lease:        lease,
		ResolveOnly:  s.opts.resolveOnly,
	})
	if err != nil {
		return nil, s.storeError(ctx, "Heartbeat", err)
	}
	return &idemgatev1.HeartbeatResponse{LeaseExpiresAt: timestamppb.New(until)}, nil
}

// Resolve implements idemgatev1.DedupeServiceServer.
func (s *Server) Resolve(ctx context.Context, req *idemgatev1.ResolveRequest) (*idemgatev1.ResolveResponse, error) {
	defer s.opts.metrics.observe("Resolve", time.Now())
	resp, err := s.resolve(ctx, req)
	s.counted(outcomeResolved, err)
	return resp, err
}

func (s *Server) resolve(ctx context.Context, req *idemgatev1.ResolveRequest) (*idemgatev1.ResolveResponse, error) {
	ns, err := namespace(ctx)
	if err != nil {
		return nil, err
	}
	if err := validateRecordID(req.GetScope(), req.GetKey(), "resolve"); err != nil {
		return nil, err
	}
	params := ResolveParams{Namespace: ns, Scope: req.GetScope(), Key: req.GetKey()}
	switch r := req.GetResolution().(type) {
	case *idemgatev1.ResolveRequest_Complete:
		outcome, err := s.validOutcome("complete", r.Complete)
		if err == nil {
			outcome, err = s.sealOutcome(params.ID(), outcome)
		}
		if err != nil {
			return nil, err
		}
		params.Complete = &outcome
	case *idemgatev1.ResolveRequest_Release_:
	default:
		return nil, invalid("resolution", "resolution is required: complete with an outcome, or release")
	}
	if err := s.store.Resolve(ctx, params); err != nil {
		return nil, s.storeError(ctx, "Resolve", err)
	}
	return &idemgatev1.ResolveResponse{}, nil
}

// ReleaseLostBegins implements idemgatev1.DedupeServiceServer.
func (s *Server) ReleaseLostBegins(ctx context.Context, req *idemgatev1.ReleaseLostBeginsRequest) (*idemgatev1.ReleaseLostBeginsResponse, error) {
	defer s.opts.metrics.observe("ReleaseLostBegins", time.Now())
	resp, err := s.releaseLostBegins(ctx, req)
	if err == nil {
		s.opts.metrics.countN(outcomeReleased, int(resp.GetReleased()))
	} else {
		s.counted(outcomeReleased, err)
	}
	return resp, err
}

func (s *Server) releaseLostBegins(ctx context.Context, req *idemgatev1.ReleaseLostBeginsRequest) (*idemgatev1.ReleaseLostBeginsResponse, error) {
	ns, err := namespace(ctx)
	if err != nil {
		return nil, err
	}
	lost := req.GetLostBegins()
	if len(lost) == 0 || len(lost) > MaxLostBegins {
		return nil, invalid("lost_begins", fmt.Sprintf("lost_begins must name 1 to %d attempts, got %d; send more in several calls", MaxLostBegins, len(lost)))
	}
	params := ReleaseLostParams{Namespace: ns, Attempts: make([]LostAttempt, len(lost)), ResolveOnly: s.opts.resolveOnly}
	for i, l := range lost {
		if err := validateRecordIDAt(fmt.Sprintf("lost_begins[%d].", i), l.GetScope(), l.GetKey(), l.GetAttemptToken()); err != nil {
			return nil, err
		}
		params.Attempts[i] = LostAttempt{Scope: l.GetScope(), Key: l.GetKey(), AttemptToken: l.GetAttemptToken()}
	}
	released, err := s.store.ReleaseLost(ctx, params)
	if err != nil {
		return nil, s.storeError(ctx, "ReleaseLostBegins", err)
	}
	return &idemgatev1.ReleaseLostBeginsResponse{Released: int32(released)}, nil
}

// storeError maps a store error to the status the caller gets. Driver errors
// are logged here and never sent: they can name another tenant's rows.
func (s *Server) storeError(ctx context.Context, rpc string, err error) error {
	switch {
	case errors.Is(err, ErrNotHeld):
		return grpcerr.New(codes.FailedPrecondition, ReasonReservationNotHeld,
			"the reservation is not held by this attempt: its lease ran out and the record was taken over or settled; the stored record is unchanged", nil, 0)
	case errors.Is(err, ErrNotUnknown):
		return grpcerr.New(codes.FailedPrecondition, ReasonRecordNotUnknown,
			"the record's outcome is not unknown: it is settled, or its attempt is still running within its lease; nothing changed", nil, 0)
	case errors.Is(err, ErrRecordNotFound):
		return grpcerr.New(codes.NotFound, ReasonRecordNotFound,
			"no live record for this scope and key: it never existed or has expired", nil, 0)
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	var quota *QuotaError
	if errors.As(err, &quota) {
		s.opts.metrics.quota(quota.Quota)
		flag := "-caller-max-records"
		if quota.Quota == QuotaBytes {
			flag = "-caller-max-bytes"
		}
		return quotaExceeded(quota.Quota, strconv.FormatInt(quota.Limit, 10),
			fmt.Sprintf("this caller holds %d %s, at its quota of %d (%s); nothing was reserved. Space frees as its records expire", quota.Used, quota.Quota, quota.Limit, flag), 0)
	}
	return s.unavailable(ctx, rpc, err, nil)
}

// unavailable logs a store failure, paced (pacedLog), and answers it
// UNAVAILABLE (DEDUPE_STORE_UNAVAILABLE) with metadata.
func (s *Server) unavailable(ctx context.Context, rpc string, err error, metadata map[string]string) error {
	if held, ok := s.storeFailures.take(time.Now()); ok {
		s.opts.logger.ErrorContext(ctx, "dedupe store failed", slog.String("rpc", rpc), slog.Any("error", err),
			slog.Int64("unlogged_since_last", held))
	}
	return grpcerr.New(codes.Unavailable, ReasonStoreUnavailable,
		"the dedupe store failed or is unreachable; the call is safe to retry", metadata, s.opts.storeRetryAfter)
}

// admitBegin waits for a place for a Begin at the store
// (WithMaxConcurrentBegins) and returns how to give it back. It gives up
// before ctx's deadline, by a quarter of what is left (at most a second),
// so the caller hears that nothing was sent instead of its own deadline.
func (s *Server) admitBegin(ctx context.Context) (leave func(), err error) {
	if s.begins == nil {
		return func() {}, nil
	}
	if s.begins.TryAcquire(1) {
		return func() { s.begins.Release(1) }, nil
	}
	waitCtx := ctx
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithDeadline(ctx, deadline.Add(-min(time.Until(deadline)/4, time.Second)))
		defer cancel()
	}
	if err := s.begins.Acquire(waitCtx, 1); err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		var metadata map[string]string
		if firstTry(ctx) {
			metadata = map[string]string{MetadataReserved: ReservedNone}
		}
		return nil, grpcerr.New(codes.Unavailable, ReasonStoreUnavailable,
			"the dedupe store is busy with other Begins (-max-concurrent-begins); nothing was reserved, retry after the delay", metadata, s.opts.storeRetryAfter)
	}
	return func() { s.begins.Release(1) }, nil
}

// firstTry reports whether ctx's call is its caller's first try: a gRPC
// client that retried it (its service config's retry policy) says how many
// tries came before in grpc-previous-rpc-attempts.
func firstTry(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("grpc-previous-rpc-attempts") {
		if v != "0" {
			return false
		}
	}
	return true
}

func (s *Server) validOutcome(field string, outcome *anypb.Any) (Outcome, error) {
	if n := len(outcome.GetValue()); n > s.opts.maxOutcome {
		return Outcome{}, grpcerr.New(codes.InvalidArgument, ReasonOutcomeTooLarge,
			fmt.Sprintf("%s is %d bytes, over this service's limit of %d; store a smaller outcome or raise -max-outcome-bytes", field, n, s.opts.maxOutcome),
			map[string]string{"field": field}, 0)
	}
	switch {
	case outcome == nil:
		return Outcome{}, invalid(field, field+" is required")
	case outcome.GetTypeUrl() == "":
		return Outcome{}, invalid(field+".type_url", field+".type_url is required")
	}
	if err := checkText(field+".type_url", field+".type_url", outcome.GetTypeUrl(), MaxTypeURLBytes); err != nil {
		return Outcome{}, err
	}
	value := outcome.GetValue()
	if value == nil {
		value = []byte{} // an empty message is a stored outcome, not a missing one
	}
	return Outcome{TypeURL: outcome.GetTypeUrl(), Value: value}, nil
}

// sealOutcome seals a validated outcome of record id with the service's
// cipher, if it has one; the size limit was checked on the plaintext.
func (s *Server) sealOutcome(id RecordID, outcome Outcome) (Outcome, error) {
	if s.opts.cipher == nil {
		return outcome, nil
	}
	keyID, sealed, err := s.opts.cipher.Seal(OutcomeAAD(id, outcome.TypeURL), outcome.Value)
	if err != nil {
		return Outcome{}, status.Errorf(codes.Internal, "dedupesvc: seal the outcome: %v", err)
	}
	return Outcome{TypeURL: outcome.TypeURL, Value: sealed, KeyID: keyID}, nil
}

// openOutcome returns the value of record id's stored outcome: as stored
// when it has no key id and the service has no cipher (or accepts
// plaintext, WithPlaintextOutcomes), else opened with the service's cipher.
// With a cipher, a plaintext row was not written by this service since
// encryption was turned on: replaying it would hand a duplicate whatever
// bytes someone wrote into the database. One that cannot be opened is
// INTERNAL DEDUPE_OUTCOME_UNREADABLE, never taken for absent: that would
// run the side effect again.
func (s *Server) openOutcome(ctx context.Context, id RecordID, outcome Outcome) ([]byte, error) {
	if outcome.KeyID == "" && (s.opts.cipher == nil || s.opts.plaintextOK) {
		return outcome.Value, nil
	}
	err := fmt.Errorf("dedupesvc: outcome sealed under key %q but no -outcome-keys-file is loaded", outcome.KeyID)
	message := "the stored outcome of this key cannot be decrypted (its key is not in the service's keys file, or the record is damaged); nothing ran, and nothing will until an operator restores the key"
	switch {
	case outcome.KeyID == "":
		err = errors.New("dedupesvc: outcome stored without encryption while encryption is on (-outcome-keys-file); -outcome-accept-plaintext replays records written before encryption was turned on")
		message = "the stored outcome of this key is not encrypted although the service encrypts outcomes: it was written before encryption was turned on, or not by this service; nothing ran, and nothing will until an operator accepts such records (-outcome-accept-plaintext) or settles the key"
	case s.opts.cipher != nil:
		var value []byte
		if value, err = s.opts.cipher.Open(outcome.KeyID, OutcomeAAD(id, outcome.TypeURL), outcome.Value); err == nil {
			return value, nil
		}
	}
	s.opts.logger.ErrorContext(ctx, "stored outcome cannot be opened; its duplicates fail until the key is restored or the key settled by hand",
		slog.String("namespace", id.Namespace), slog.String("scope", id.Scope), slog.String("key", id.Key),
		slog.String("outcome_key_id", outcome.KeyID), slog.Any("error", err))
	return nil, grpcerr.New(codes.Internal, ReasonOutcomeUnreadable, message,
		map[string]string{"outcome_key_id": outcome.KeyID}, 0)
}

func validateRecordID(scope, key, token string) error {
	return validateRecordIDAt("", scope, key, token)
}

// validateRecordIDAt is validateRecordID for fields named after prefix (an
// element of a list, "lost_begins[3].").
func validateRecordIDAt(prefix, scope, key, token string) error {
	if scope == "" {
		return invalid(prefix+"scope", prefix+"scope is required")
	}
	if err := checkText(prefix+"scope", prefix+"scope", scope, MaxScopeBytes); err != nil {
		return err
	}
	if err := keys.Validate(key); err != nil {
		return invalid(prefix+"key", prefix+"key "+err.Error())
	}
	switch {
	case token == "":
		return invalid(prefix+"attempt_token", prefix+"attempt_token is required")
	case len(token) > MaxAttemptTokenBytes:
		return invalid(prefix+"attempt_token", fmt.Sprintf("%sattempt_token is longer than %d bytes", prefix, MaxAttemptTokenBytes))
	case !keys.Printable(token):
		return invalid(prefix+"attempt_token", prefix+"attempt_token must be printable ASCII")
	}
	return nil
}

func duration(field string, d *durationpb.Duration, lo, hi time.Duration) (time.Duration, error) {
	if d == nil {
		return 0, invalid(field, field+" is required")
	}
	if err := d.CheckValid(); err != nil {
		return 0, invalid(field, field+" is not a valid duration")
	}
	v := d.AsDuration()
	if v < lo || v > hi {
		return 0, invalid(field, fmt.Sprintf("%s must be between %s and %s, got %s", field, lo, hi, v))
	}
	return v, nil
}

func invalid(field, message string) error {
	return grpcerr.New(codes.InvalidArgument, ReasonInvalidRequest, message, map[string]string{"field": field}, 0)
}

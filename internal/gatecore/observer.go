package gatecore

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/keys"
)

// What the tool server says about its Dedupe service. Without it a tool
// server whose Dedupe service is down, or refuses its credentials, fails
// every gated call and logs nothing, and its own health looks fine.

// DefaultDedupeFailureLogInterval is how often at most a Dedupe RPC failure
// is logged while the failure stays the same (NewObserver's logEvery).
const DefaultDedupeFailureLogInterval = 10 * time.Second

// dedupeRecheckInterval is how often Watch re-checks a Dedupe service
// whose last answer was a failure, so health recovers without traffic.
const dedupeRecheckInterval = 5 * time.Second

// DefaultDedupeTimeout bounds a Check whose context has no deadline when
// Watch runs it without a connection to follow: 5s, the gates' default
// Dedupe timeout.
const DefaultDedupeTimeout = 5 * time.Second

// Observer is a gate's Dedupe client: it passes every call through and
// watches the answers, logging failures (rate-limited) and keeping whether
// the last answer was one, so a tool server whose Dedupe service is down, or
// refuses its credentials, says so in its log and its health instead of
// failing every gated call silently. It is safe for concurrent use.
type Observer struct {
	idemgatev1.DedupeServiceClient
	conn   *grpc.ClientConn
	target string
	logger *slog.Logger
	every  time.Duration
	now    func() time.Time

	mu sync.Mutex
	// failing: the last answer was a failure other than a quota refusal
	// (RESOURCE_EXHAUSTED), which health follows.
	failing bool
	// logged: a failure line was written since the last recovery line.
	logged bool
	// lastCode and lastLine are the code and time of the last failure line.
	lastCode codes.Code
	lastLine time.Time
	// suppressed counts failures not logged since the last line; failures
	// counts those since the last success.
	suppressed, failures int
	// changed is signalled when failing flips.
	changed chan struct{}
}

// NewObserver returns client observed: every RPC passes through, and its
// failures are logged (the first at once, then at most one line per
// logEvery while the same failure goes on, DefaultDedupeFailureLogInterval
// when not positive) and kept for Check and Watch. With conn (the
// connection client uses; nil when unknown) the log lines name its target,
// Watch follows its connectivity, and an UNAVAILABLE answer makes it
// reconnect at once instead of after grpc-go's reconnect backoff
// (Reconnecting). Without conn, unless client says it calls the service
// in this process (an InProcess() bool method reporting true, as
// dedupesvc.NewInProcessClient's does), it logs a warning: the gate cannot then
// hurry a reconnect, and it is not refused because a client need not be a
// network one (in-process, wrapped) and every gate built so far would break.
func NewObserver(client idemgatev1.DedupeServiceClient, conn *grpc.ClientConn, logger *slog.Logger, logEvery time.Duration) *Observer {
	if conn != nil {
		client = Reconnecting(client, conn)
	}
	if logger == nil {
		logger = slog.Default()
	}
	if ip, ok := client.(interface{ InProcess() bool }); conn == nil && !(ok && ip.InProcess()) {
		logger.Warn("idemgate: the gate was built without WithDedupeConn: after a Dedupe service restart or a dropped connection, its client waits out grpc-go's reconnect backoff (up to two minutes), " +
			"longer than a lease, so a live holder cannot renew in time and its key may be handed to a duplicate (REEXECUTE) or marked outcome-unknown (FAIL_CLOSED); " +
			"pass the connection the Dedupe client uses with WithDedupeConn")
	}
	d := &Observer{DedupeServiceClient: client, conn: conn, logger: logger, every: logEvery, now: time.Now, changed: make(chan struct{}, 1)}
	if d.every <= 0 {
		d.every = DefaultDedupeFailureLogInterval
	}
	if conn != nil {
		d.target = conn.Target()
	}
	return d
}

// Begin implements idemgatev1.DedupeServiceClient.
func (d *Observer) Begin(ctx context.Context, in *idemgatev1.BeginRequest, opts ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	resp, err := d.DedupeServiceClient.Begin(ctx, in, opts...)
	d.observe("Begin", err, true)
	return resp, err
}

// Finish implements idemgatev1.DedupeServiceClient.
func (d *Observer) Finish(ctx context.Context, in *idemgatev1.FinishRequest, opts ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	resp, err := d.DedupeServiceClient.Finish(ctx, in, opts...)
	d.observe("Finish", err, true)
	return resp, err
}

// Release implements idemgatev1.DedupeServiceClient.
func (d *Observer) Release(ctx context.Context, in *idemgatev1.ReleaseRequest, opts ...grpc.CallOption) (*idemgatev1.ReleaseResponse, error) {
	resp, err := d.DedupeServiceClient.Release(ctx, in, opts...)
	d.observe("Release", err, true)
	return resp, err
}

// Heartbeat implements idemgatev1.DedupeServiceClient.
func (d *Observer) Heartbeat(ctx context.Context, in *idemgatev1.HeartbeatRequest, opts ...grpc.CallOption) (*idemgatev1.HeartbeatResponse, error) {
	resp, err := d.DedupeServiceClient.Heartbeat(ctx, in, opts...)
	d.observe("Heartbeat", err, true)
	return resp, err
}

// Resolve implements idemgatev1.DedupeServiceClient.
func (d *Observer) Resolve(ctx context.Context, in *idemgatev1.ResolveRequest, opts ...grpc.CallOption) (*idemgatev1.ResolveResponse, error) {
	resp, err := d.DedupeServiceClient.Resolve(ctx, in, opts...)
	d.observe("Resolve", err, true)
	return resp, err
}

// ReleaseLostBegins implements idemgatev1.DedupeServiceClient. A service
// of an earlier version answers UNIMPLEMENTED, which is no failure: the
// follow-up then re-sends each lost Begin instead.
func (d *Observer) ReleaseLostBegins(ctx context.Context, in *idemgatev1.ReleaseLostBeginsRequest, opts ...grpc.CallOption) (*idemgatev1.ReleaseLostBeginsResponse, error) {
	resp, err := d.DedupeServiceClient.ReleaseLostBegins(ctx, in, opts...)
	if status.Code(err) != codes.Unimplemented {
		d.observe("ReleaseLostBegins", err, true)
	}
	return resp, err
}

// dedupeFailed reports whether err means the Dedupe service could not serve
// the tool server: unreachable, too slow, refusing its credentials, over its
// quota, or broken. The answers the protocol expects (a fenced attempt, a
// record not found) and the caller's own cancellation are not failures.
func dedupeFailed(err error) bool {
	switch status.Code(err) {
	case codes.OK, codes.Canceled, codes.FailedPrecondition, codes.Aborted, codes.NotFound, codes.AlreadyExists:
		return false
	default:
		return true
	}
}

// observe notes one RPC's answer; log says whether a failure may be
// logged (Check reports its own).
func (d *Observer) observe(rpc string, err error, log bool) {
	failed := dedupeFailed(err)
	// A quota refusal is logged as a failure but is an answer: the service
	// is reachable and serves the others, often the other agents behind
	// this tool server, so it leaves health alone.
	down := failed && status.Code(err) != codes.ResourceExhausted
	d.mu.Lock()
	defer d.mu.Unlock()
	if down != d.failing {
		d.failing = down
		select {
		case d.changed <- struct{}{}:
		default:
		}
	}
	if !failed {
		if d.logged {
			d.logger.Info("idemgate: the Dedupe service answers again", d.targetAttr(),
				slog.Int("failures", d.failures), slog.Int("suppressed", d.suppressed))
		}
		d.logged, d.failures, d.suppressed = false, 0, 0
		return
	}
	d.failures++
	if !log {
		return
	}
	code := status.Code(err)
	now := d.now()
	if (d.logged && code == d.lastCode && now.Sub(d.lastLine) < d.every) || (!d.logged && !d.lastLine.IsZero() && now.Sub(d.lastLine) < d.every) {
		// The same failure again within the interval, or a failure
		// right after a recovery (a flapping service): counted.
		d.suppressed++
		return
	}
	// The message is the service's or the transport's: it names the
	// problem (an unknown token, a refused connection) and never carries
	// the credentials, which travel in metadata this never reads.
	d.logger.Error("idemgate: a Dedupe service RPC failed; gated calls fail closed (the handler does not run) until it answers",
		d.targetAttr(), slog.String("rpc", rpc), slog.String("code", code.String()), slog.String("message", status.Convert(err).Message()),
		slog.Int("suppressed", d.suppressed), slog.String("hint", dedupeHint(code)))
	d.logged, d.lastCode, d.lastLine, d.suppressed = true, code, now, 0
}

// targetAttr is the Dedupe service's address, when NewObserver was given its connection.
func (d *Observer) targetAttr() slog.Attr {
	if d.target == "" {
		return slog.Attr{}
	}
	return slog.String("dedupe", d.target)
}

// dedupeHint says what to check for a failure's code.
func dedupeHint(code codes.Code) string {
	switch code {
	case codes.Unauthenticated:
		return "the Dedupe service does not know this tool server's credentials: check its bearer token (the service's -token-file) or client certificate (-tls-client-ca)"
	case codes.PermissionDenied:
		return "the Dedupe service knows this tool server but refuses it this RPC: check its rights there"
	case codes.Unavailable, codes.DeadlineExceeded:
		return "check that the Dedupe service runs at this address, that the network lets this tool server reach it, and its own log for store failures"
	case codes.ResourceExhausted:
		return "this tool server is over a quota at the Dedupe service (-caller-* flags there)"
	case codes.Unimplemented:
		return "the address answers gRPC but is not a Dedupe service, or one too old for this gate"
	default:
		return "see the Dedupe service's log"
	}
}

// healthy reports whether gated calls can reach the Dedupe service now: the
// connection, when known, is not failing, and the last answer was not a
// failure; a quota refusal (RESOURCE_EXHAUSTED) is one caller's, not the
// service's, and counts as an answer.
func (d *Observer) healthy() bool {
	d.mu.Lock()
	failing := d.failing
	d.mu.Unlock()
	if failing {
		return false
	}
	if d.conn == nil {
		return true
	}
	return d.conn.GetState() == connectivity.Ready
}

// probeScope and probeKey name the record CheckDedupe asks about (see
// keys.ProbeScope): it never exists, and the service does not count the
// probe among its outcomes.
const (
	probeScope = keys.ProbeScope
	probeKey   = keys.ProbeKey
)

// Check asks the Dedupe service whether it serves this tool server,
// for a start-up check: it renews the lease of a record that never exists
// (one Heartbeat), which crosses the network, the service's authentication
// and request validation and reads its store, and changes nothing; a working
// service answers that the reservation is not held (and does not count the
// probe as a fenced renewal, nor as any outcome). It returns nil then. Otherwise it returns UNAVAILABLE
// (IDEMPOTENCY_STORE_UNAVAILABLE) when the service or its store cannot be
// reached or is too slow, or INTERNAL (IDEMPOTENCY_STORE_REJECTED) when the
// service refuses this tool server or its request; either with ErrorInfo
// metadata "dedupe_code" (the service's status code) and, with
// a connection, "dedupe" (its address). ctx bounds the check; without a
// deadline, timeout does.
func (d *Observer) Check(ctx context.Context, timeout time.Duration) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	_, err := d.DedupeServiceClient.Heartbeat(ctx, &idemgatev1.HeartbeatRequest{
		Scope: probeScope, Key: probeKey, AttemptToken: probeKey, Epoch: 1, Lease: durationpb.New(time.Second),
	})
	d.observe("Heartbeat", err, false)
	if !dedupeFailed(err) {
		return nil
	}
	code := status.Code(err)
	meta := map[string]string{"dedupe_code": code.String()}
	where := "the Dedupe service"
	if d.target != "" {
		meta["dedupe"] = d.target
		where += " at " + d.target
	}
	msg := status.Convert(err).Message()
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Internal, codes.Unknown, codes.ResourceExhausted:
		return grpcerr.New(codes.Unavailable, idemgate.ReasonStoreUnavailable,
			where+" cannot serve this tool server ("+code.String()+": "+msg+"); gated calls fail closed until it can: "+dedupeHint(code), meta, 0)
	default:
		return grpcerr.New(codes.Internal, idemgate.ReasonStoreRejected,
			where+" refuses this tool server ("+code.String()+": "+msg+"); gated calls fail closed until that is fixed: "+dedupeHint(code), meta, 0)
	}
}

// Watch keeps hs's status for idemgate.DedupeHealthService in step with the
// Dedupe service until ctx ends, then returns: NOT_SERVING while the
// connection (NewObserver's) is not ready or the service's last answer to
// a gated call or a check was a failure (unreachable, refusing this tool
// server, broken; not a quota refusal, which is one caller's), SERVING
// otherwise; it starts NOT_SERVING until it knows.
// It keeps the connection connecting when it falls idle, so a service that
// went away is noticed without traffic, checks each new connection once it
// is ready (which also authenticates it at once), and re-checks a failing
// service every 5s (Check), so health recovers without traffic too. Each
// change is logged. Run it in its own goroutine.
func (d *Observer) Watch(ctx context.Context, hs idemgate.HealthSetter) {
	states := make(chan struct{}, 1)
	if d.conn != nil {
		go func() {
			for state := d.conn.GetState(); ; state = d.conn.GetState() {
				if state == connectivity.Idle {
					d.conn.Connect()
				}
				select {
				case states <- struct{}{}:
				default:
				}
				if !d.conn.WaitForStateChange(ctx, state) {
					return
				}
			}
		}()
	}
	if d.conn == nil {
		// Nothing to watch but answers: ask once.
		_ = d.Check(ctx, DefaultDedupeTimeout)
	}
	serving := false
	hs.SetServingStatus(idemgate.DedupeHealthService, healthpb.HealthCheckResponse_NOT_SERVING)
	recheck := time.NewTicker(dedupeRecheckInterval)
	defer recheck.Stop()
	var lastLine time.Time
	wasReady := false
	for {
		if d.conn != nil {
			// Each new connection is checked at once, without waiting for
			// a gated call: it proves the credentials, and a Dedupe service
			// closes a connection that has not authenticated soon after it
			// opened (-unauthenticated-timeout), which would cut a quiet
			// tool server's connection, and flap its health, again and again.
			ready := d.conn.GetState() == connectivity.Ready
			if ready && !wasReady {
				_ = d.Check(ctx, DefaultDedupeTimeout)
			}
			wasReady = ready
		}
		if now := d.healthy(); now != serving {
			serving = now
			// A flapping service changes health often: a change within
			// the log interval of the last line is logged at debug
			// level only (the failures themselves are logged above).
			level := slog.LevelInfo
			if !lastLine.IsZero() && d.now().Sub(lastLine) < d.every {
				level = slog.LevelDebug
			} else {
				lastLine = d.now()
			}
			// The line before the status: whoever sees the status change
			// (a probe, a test) finds the line that explains it.
			if serving {
				d.logger.Log(ctx, level, "idemgate: the Dedupe service is reachable; health "+idemgate.DedupeHealthService+" SERVING", d.targetAttr())
				hs.SetServingStatus(idemgate.DedupeHealthService, healthpb.HealthCheckResponse_SERVING)
			} else {
				attrs := []any{d.targetAttr()}
				if d.conn != nil {
					attrs = append(attrs, slog.String("connection", d.conn.GetState().String()))
				}
				if level == slog.LevelInfo {
					level = slog.LevelWarn
				}
				d.logger.Log(ctx, level, "idemgate: the Dedupe service is unreachable or refusing; health "+idemgate.DedupeHealthService+" NOT_SERVING, gated calls fail closed", attrs...)
				hs.SetServingStatus(idemgate.DedupeHealthService, healthpb.HealthCheckResponse_NOT_SERVING)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-states:
		case <-d.changed:
		case <-recheck.C:
			d.mu.Lock()
			failing := d.failing
			d.mu.Unlock()
			if failing {
				_ = d.Check(ctx, DefaultDedupeTimeout)
			}
		}
	}
}

package gatecore

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// The follow-ups' schedule. While the Dedupe service does not answer, one
// re-sent Begin is in flight at a time and the next waits a backoff shared
// by all of them (from followUpMinBackoff, doubling up to
// followUpMaxBackoff, each wait jittered down to half), so an outage costs
// one Begin per backoff step, however many Begins it lost. Once the service
// answers, the rest are re-sent one at a time, at most followUpRate a
// second: well under the service's default per-caller rate (500/s), so the
// follow-ups cannot use up the callers' quota.
const (
	followUpMinBackoff = 50 * time.Millisecond
	followUpMaxBackoff = 5 * time.Second
	followUpRate       = 100
	followUpBurst      = 10
)

// maxLostBeginFollowUps bounds the lost Begins waiting to be followed up;
// past it a lost Begin is logged and counted, and its reservation, if it
// was made, runs down its lease.
const maxLostBeginFollowUps = 1024

// followUps are the lost Begins waiting to be re-sent, in line, and
// whether the one goroutine that re-sends them (followUp) runs.
type followUps struct {
	mu      sync.Mutex
	queue   []*lostBegin
	pending map[lostBeginID]struct{} // queued or being re-sent
	running bool
}

// lostBeginID names one attempt: its lost Begins are re-sent as one.
type lostBeginID struct{ scope, key, token string }

// lostBegin is one Begin whose answer never arrived.
type lostBegin struct {
	id lostBeginID
	// ctx is the caller's context without its cancellation, for logs.
	ctx context.Context
	c   *Call
	req *idemgatev1.BeginRequest
	// deadline ends its follow-up: the finish retry budget after the loss.
	deadline time.Time
}

// followUpLostBegin runs after a Begin whose answer never arrived: the
// reservation may have been made, and the handler certainly did not run,
// so it must not block the key. It queues the same Begin (the same attempt
// token) to be re-sent by followUp until an answer arrives or the finish
// retry budget runs out; what the answer shows reserved is released.
func (e *Engine) followUpLostBegin(ctx context.Context, c *Call) {
	e.Event(c, EventBeginLost)
	f := &e.followUps
	id := lostBeginID{c.Scope, c.Key, c.Token}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.pending[id]; ok {
		return // one re-sent Begin finds what either made
	}
	if len(f.pending) >= maxLostBeginFollowUps {
		e.opts.Logger.WarnContext(ctx, "idemgate: too many lost Begins are being followed up; if this one made a reservation, it runs down its lease",
			slog.String("scope", c.Scope))
		return
	}
	if !f.running {
		if !e.startBackground() {
			e.opts.Logger.WarnContext(ctx, "idemgate: the Gate is closed, so a lost Begin is not followed up; if it made a reservation, it runs down its lease",
				slog.String("scope", c.Scope))
			return
		}
		f.running = true
		go e.followUp()
	}
	req := proto.CloneOf(c.BeginRequest)
	req.MaxWait = durationpb.New(0)
	if f.pending == nil {
		f.pending = map[lostBeginID]struct{}{}
	}
	f.pending[id] = struct{}{}
	f.queue = append(f.queue, &lostBegin{id: id, ctx: context.WithoutCancel(ctx), c: c, req: req, deadline: time.Now().Add(e.opts.FinishBudget)})
}

// followUp re-sends the queued lost Begins, one at a time, until none is
// left: on the shared backoff while the Dedupe service does not answer, at
// the capped rate while it does. It stops early when Close's context ends.
func (e *Engine) followUp() {
	defer e.background.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer context.AfterFunc(e.backgroundCtx, cancel)()
	limit := rate.NewLimiter(followUpRate, followUpBurst)
	// The Begin that queued the first one just failed: wait before trying.
	backoff := followUpMinBackoff
	for {
		if backoff > 0 && !sleep(ctx, backoff/2+rand.N(backoff/2+1)) {
			e.dropFollowUps(nil, "the Gate was closed")
			return
		}
		lb := e.nextFollowUp()
		if lb == nil {
			return
		}
		if limit.Wait(ctx) != nil {
			e.dropFollowUps(lb, "the Gate was closed")
			return
		}
		callCtx, cancelCall := context.WithTimeout(ctx, e.opts.DedupeTimeout)
		res, err := e.dedupe.Begin(callCtx, lb.req)
		cancelCall()
		switch {
		case err == nil:
			if reserved := res.GetReserved(); reserved != nil {
				lease := e.keepLease(lb.ctx, lb.c, reserved.GetEpoch(), 0, func() {})
				e.release(lb.ctx, lb.c, reserved.GetEpoch(), false, lease)
			}
			e.doneFollowUp(lb)
			backoff = 0
		case ctx.Err() != nil:
			e.dropFollowUps(lb, "the Gate was closed")
			return
		case refused(err) && status.Code(err) != codes.ResourceExhausted:
			// A refusal that will not change: nothing more to learn.
			e.lostFollowUp(lb, err)
			backoff = 0
		default:
			// Not answered (or over the quota): it goes last in line (one
			// that keeps failing must not hold the others up), and the next
			// one waits the next backoff step.
			e.requeueFollowUp(lb)
			backoff = min(max(2*backoff, followUpMinBackoff), followUpMaxBackoff)
			if retry, ok := grpcerr.RetryDelay(err); ok && retry > backoff {
				backoff = min(retry, followUpMaxBackoff)
			}
		}
	}
}

// nextFollowUp takes the first lost Begin in line still within its budget
// (giving up those past it), or returns nil, and the goroutine must stop,
// when none is left.
func (e *Engine) nextFollowUp() *lostBegin {
	f := &e.followUps
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.queue) > 0 {
		lb := f.queue[0]
		f.queue[0] = nil
		f.queue = f.queue[1:]
		if time.Now().Before(lb.deadline) {
			return lb
		}
		delete(f.pending, lb.id)
		e.logLostFollowUp(lb, "the retry budget ran out")
	}
	f.queue, f.running = nil, false
	return nil
}

// requeueFollowUp puts lb back, last in line.
func (e *Engine) requeueFollowUp(lb *lostBegin) {
	f := &e.followUps
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queue = append(f.queue, lb)
}

// doneFollowUp forgets lb, followed up.
func (e *Engine) doneFollowUp(lb *lostBegin) {
	f := &e.followUps
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pending, lb.id)
}

// lostFollowUp gives lb up after the service refused it.
func (e *Engine) lostFollowUp(lb *lostBegin, err error) {
	e.doneFollowUp(lb)
	e.logLostFollowUp(lb, status.Convert(err).Message())
}

// dropFollowUps gives up lb (when not nil) and every queued lost Begin, and
// marks the goroutine stopped: Close's context ended.
func (e *Engine) dropFollowUps(lb *lostBegin, why string) {
	f := &e.followUps
	f.mu.Lock()
	queue := f.queue
	if lb != nil {
		queue = append([]*lostBegin{lb}, queue...)
	}
	f.queue, f.pending, f.running = nil, nil, false
	f.mu.Unlock()
	for _, lb := range queue {
		e.logLostFollowUp(lb, why)
	}
}

func (e *Engine) logLostFollowUp(lb *lostBegin, why string) {
	e.opts.Logger.ErrorContext(lb.ctx, "idemgate: could not follow up a Begin whose answer was lost ("+why+"); if it made a reservation, the key goes down its on_lost_outcome path when the lease runs out",
		slog.String("scope", lb.c.Scope))
}

package gatecore

import (
	"container/heap"
	"context"
	"errors"
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
// follow-up call (a batch: see followUpBatch) is in flight at a time and
// the next waits a backoff shared by all of them (from followUpMinBackoff,
// doubling up to followUpMaxBackoff or a quarter of the shortest lease
// waiting, whichever is less, each wait jittered down to half), so an
// outage costs one call per backoff step, however many Begins it lost, and
// the follow-ups learn the service answers again within a quarter lease
// (sooner when one of the Gate's own Begins is answered). Once the service
// answers, the lost Begins go in batches, the ones whose leases run out
// first first, at most followUpRate calls a second. With a service of an
// earlier version, which has no ReleaseLostBegins, each lost Begin is
// re-sent and what it finds reserved released: up to followUpInFlight at
// once, at most followUpRate a second (a fortieth of the service's default
// per-caller rate, 10,000/s, so the follow-ups cannot use up the callers'
// quota); followUpInFlight keeps that rate while a recovering service
// takes up to a quarter second per Begin and its Release, so a slow
// service or a crowd of lost Begins that reserved nothing cannot hold up
// one that did.
const (
	followUpMinBackoff = 50 * time.Millisecond
	followUpMaxBackoff = 5 * time.Second
	followUpInFlight   = 64
	followUpRate       = 250
	followUpBurst      = 25
)

// The follow-ups' batches: a service that has ReleaseLostBegins frees up to
// followUpBatch lost Begins in one call (one store round trip and one
// commit), at most followUpBatchesInFlight calls at once, so a crowd of
// lost Begins costs a few calls, not a Begin and a Release each at
// followUpRate a second: 2,048 go in 8 calls, 2 at a time. Under the
// service's limit (500), so one statement batch stays short beside the
// callers' Begins. While the service does not answer, one batch goes per
// backoff step.
const (
	followUpBatch           = 256
	followUpBatchesInFlight = 2
)

// maxLostBeginFollowUps bounds the lost Begins waiting to be followed up
// (a few hundred bytes each); past it a lost Begin is logged and counted,
// and its reservation, if it was made, runs down its lease. A store outage
// under load fills the queue with the Begins that timed out in the herd
// once it is back (each may have reserved), for a few seconds: 2,048 were
// not enough for 800 actions of 6 callers each (chaos
// postgres/crash-under-load), and were dropping Begins that had reserved.
const maxLostBeginFollowUps = 16384

// followUps are the lost Begins waiting to be re-sent, in line by when
// their leases run out, and whether the goroutine that re-sends them
// (followUp) runs.
type followUps struct {
	mu      sync.Mutex
	queue   lostBeginQueue
	pending map[lostBeginID]*lostBegin // queued or being re-sent
	// keys counts the pending ones per key, so a duplicate's answer looks
	// for its key's only when there is one.
	keys    map[lostBeginKey]int
	running bool
	// wake cuts the follow-up's backoff short: the service answered one of
	// the Gate's Begins.
	wake chan struct{}
	// oneByOne: the service answered ReleaseLostBegins UNIMPLEMENTED (an
	// earlier version), so each lost Begin is re-sent and what it finds
	// reserved released.
	oneByOne bool
}

// lostBeginID names one attempt: its lost Begins are re-sent as one.
type lostBeginID struct{ scope, key, token string }

// lostBeginKey names a record.
type lostBeginKey struct{ scope, key string }

// forget drops lb from the pending ones; f.mu is held.
func (f *followUps) forget(lb *lostBegin) {
	delete(f.pending, lb.id)
	k := lostBeginKey{lb.id.scope, lb.id.key}
	if f.keys[k] <= 1 {
		delete(f.keys, k)
		return
	}
	f.keys[k]--
}

// lostBegin is one attempt whose Begin's answer never arrived.
type lostBegin struct {
	id lostBeginID
	// ctx is the caller's context without its cancellation, for logs.
	ctx context.Context
	c   *Call
	req *idemgatev1.BeginRequest
	// deadline ends its follow-up, release included: the finish retry
	// budget after its last loss.
	deadline time.Time
	// leaseEnds is the earliest its reservation, if made, can run out: its
	// first lost Begin's sending plus its lease (the store may have
	// granted more after an outage, never less). It is re-sent before those
	// whose leases run out later, unless due marks it wanted now.
	leaseEnds time.Time
	// lease is its Begin's lease.
	lease time.Duration
	// wanted: a duplicate of its key was told the key is outcome-unknown,
	// so it goes first.
	wanted bool
	// failedUp: its last re-send failed while others got answers, so once
	// in line it lets the next go first, and one that keeps failing does
	// not hold the others up.
	failedUp bool
	// index is its place in the queue, -1 when not queued.
	index int
	// inFlight: its re-sent Begin is on its way. again: it was lost once
	// more meanwhile, and that Begin may reach the service after the re-sent
	// one (and after its Release), so it is re-sent once more after.
	inFlight, again bool
}

// lostBeginQueue is a heap of the lost Begins waiting, the one wanted by a
// duplicate first, then by when their leases run out (container/heap).
type lostBeginQueue []*lostBegin

func (q lostBeginQueue) Len() int { return len(q) }

func (q lostBeginQueue) Less(i, j int) bool {
	if q[i].wanted != q[j].wanted {
		return q[i].wanted
	}
	return q[i].leaseEnds.Before(q[j].leaseEnds)
}

func (q lostBeginQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}

func (q *lostBeginQueue) Push(x any) {
	lb := x.(*lostBegin)
	lb.index = len(*q)
	*q = append(*q, lb)
}

func (q *lostBeginQueue) Pop() any {
	old := *q
	lb := old[len(old)-1]
	old[len(old)-1] = nil
	lb.index = -1
	*q = old[:len(old)-1]
	return lb
}

// followUpLostBegin runs after a Begin whose answer never arrived: the
// reservation may have been made, and the handler certainly did not run,
// so it must not block the key. It queues the attempt for followUp, which
// frees what it reserved (ReleaseLostBegins) once the service answers, or
// until the finish retry budget runs out. Once Close began, it only logs
// the loss: Close must not wait for a budget that starts after it. sent is
// when the lost Begin was sent: its reservation, if made, lasts at least
// its lease from then.
func (e *Engine) followUpLostBegin(ctx context.Context, c *Call, sent time.Time) {
	e.Event(c, EventBeginLost)
	f := &e.followUps
	id := lostBeginID{c.Scope, c.Key, c.Token}
	deadline := time.Now().Add(e.opts.FinishBudget)
	f.mu.Lock()
	defer f.mu.Unlock()
	if lb, ok := f.pending[id]; ok {
		// Queued, its re-sent Begin goes after this one and finds what
		// either made; in flight, it may not, so it goes again after. Its
		// place in line stays that of the first loss: the earliest its
		// reservation can run out.
		lb.again = lb.again || lb.inFlight
		lb.deadline = deadline
		return
	}
	if len(f.pending) >= maxLostBeginFollowUps {
		e.opts.Logger.WarnContext(ctx, "idemgate: too many lost Begins are being followed up; if this one made a reservation, it runs down its lease",
			slog.String("scope", c.Scope))
		return
	}
	e.backgroundMu.Lock()
	closing := e.closing
	if !closing && !f.running {
		e.background.Add(1)
	}
	e.backgroundMu.Unlock()
	if closing {
		e.opts.Logger.WarnContext(ctx, "idemgate: the Gate is closed, so a lost Begin is not followed up; if it made a reservation, it runs down its lease",
			slog.String("scope", c.Scope))
		return
	}
	if !f.running {
		f.running = true
		go e.followUp()
	}
	req := proto.CloneOf(c.BeginRequest)
	req.MaxWait = durationpb.New(0)
	if f.pending == nil {
		f.pending = map[lostBeginID]*lostBegin{}
		f.keys = map[lostBeginKey]int{}
	}
	lease := c.BeginRequest.GetLease().AsDuration()
	lb := &lostBegin{id: id, ctx: context.WithoutCancel(ctx), c: c, req: req, deadline: deadline,
		leaseEnds: sent.Add(lease), lease: lease, index: -1}
	f.pending[id] = lb
	f.keys[lostBeginKey{c.Scope, c.Key}]++
	heap.Push(&f.queue, lb)
}

// wakeFollowUp cuts the follow-up's backoff short, if it waits.
func (e *Engine) wakeFollowUp() {
	select {
	case e.followUps.wake <- struct{}{}:
	default:
	}
}

// lostBeginHolds reports whether a Begin of key in scope sent by this Gate
// was lost and is still to be followed up, and puts it first in line: a
// duplicate that finds the key outcome-unknown may be waiting on a
// reservation whose handler never ran, which the follow-up releases. (One
// that finds it in flight need not: its lease still runs, and the line's
// order by lease deadline reaches it in time.)
func (e *Engine) lostBeginHolds(scope, key string) bool {
	f := &e.followUps
	f.mu.Lock()
	found := false
	if f.keys[lostBeginKey{scope, key}] == 0 {
		f.mu.Unlock()
		return false
	}
	for id, lb := range f.pending {
		if id.scope != scope || id.key != key {
			continue
		}
		found = true
		if !lb.wanted {
			lb.wanted = true
			if lb.index >= 0 {
				heap.Fix(&f.queue, lb.index)
			}
		}
	}
	f.mu.Unlock()
	if found {
		e.wakeFollowUp()
	}
	return found
}

// followUpResult is what one follow-up call found.
type followUpResult struct {
	batch []*lostBegin
	// sentUp: it was sent while the service answered.
	sentUp bool
	err    error
}

// followUp releases the queued lost Begins until none is left, in batches
// (ReleaseLostBegins), or one by one (a re-sent Begin, then a Release) with
// a service of an earlier version: one call at a time on the shared
// backoff while the Dedupe service does not answer, several at once (at
// the capped rate) while it does. It stops early when Close's context
// ends.
func (e *Engine) followUp() {
	defer e.background.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer context.AfterFunc(e.backgroundCtx, cancel)()
	limit := rate.NewLimiter(followUpRate, followUpBurst)
	results := make(chan followUpResult, followUpInFlight)
	inFlight, stopped := 0, false
	// The Begin that queued the first one just failed: wait before trying.
	up, backoff := false, followUpMinBackoff
	for {
		for ctx.Err() == nil && (up && inFlight < e.followUpsAtOnce() || !up && inFlight == 0) {
			if !up {
				wait := min(backoff, e.followUpBackoffCap())
				if !e.sleepOrWake(ctx, wait/2+rand.N(wait/2+1)) {
					break
				}
			}
			batch := e.nextFollowUps(inFlight == 0)
			if len(batch) == 0 {
				stopped = inFlight == 0
				break
			}
			if limit.Wait(ctx) != nil {
				e.requeueFollowUps(batch, false)
				break
			}
			inFlight++
			go func(sentUp bool) { results <- followUpResult{batch, sentUp, e.releaseLostBegins(ctx, batch)} }(up)
			if !up {
				break // one at a time: wait for its answer
			}
		}
		if inFlight == 0 {
			if !stopped {
				e.dropFollowUps("the Gate was closed")
			}
			return
		}
		// Lost Begins queued meanwhile wait for the next one back (within
		// DedupeTimeout, plus its release).
		r := <-results
		inFlight--
		switch {
		case r.err == nil:
			for _, lb := range r.batch {
				e.doneFollowUp(lb)
			}
			up, backoff = true, 0
		case len(r.batch) > 1 && status.Code(r.err) == codes.Unimplemented || errors.Is(r.err, errOneByOne):
			// An earlier service: the same lost Begins, one by one.
			e.requeueFollowUps(r.batch, false)
			up, backoff = true, 0
		case ctx.Err() != nil:
			for _, lb := range r.batch {
				e.lostFollowUp(lb, "the Gate was closed")
			}
		case refused(r.err) && status.Code(r.err) != codes.ResourceExhausted:
			// A refusal that will not change: nothing more to learn.
			for _, lb := range r.batch {
				e.lostFollowUp(lb, status.Convert(r.err).Message())
			}
			up, backoff = true, 0
		default:
			// Not answered (or over the quota): they go back in line, behind
			// the next if others got answers (one that keeps failing must
			// not hold the others up), and the next one waits the next
			// backoff step once those in flight are back.
			e.requeueFollowUps(r.batch, r.sentUp && up)
			switch {
			case !r.sentUp:
				backoff = min(max(2*backoff, followUpMinBackoff), followUpMaxBackoff)
			case up:
				backoff = followUpMinBackoff
			}
			up = false
			if retry, ok := grpcerr.RetryDelay(r.err); ok && retry > backoff {
				backoff = min(retry, followUpMaxBackoff)
			}
		}
	}
}

// errOneByOne: a batch was sent after the service answered UNIMPLEMENTED;
// its lost Begins go back in line to be re-sent one by one.
var errOneByOne = errors.New("gatecore: the Dedupe service releases lost Begins one by one")

// followUpsAtOnce is how many follow-up calls may be in flight at once
// while the service answers.
func (e *Engine) followUpsAtOnce() int {
	f := &e.followUps
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.oneByOne {
		return followUpInFlight
	}
	return followUpBatchesInFlight
}

// releaseLostBegins frees what batch's lost Begins reserved: in one
// ReleaseLostBegins call, or, with a service that answers it
// UNIMPLEMENTED, by re-sending a lone lost Begin and releasing what it
// finds reserved.
func (e *Engine) releaseLostBegins(ctx context.Context, batch []*lostBegin) error {
	e.followUps.mu.Lock()
	oneByOne := e.followUps.oneByOne
	e.followUps.mu.Unlock()
	if oneByOne {
		if len(batch) > 1 {
			return errOneByOne
		}
		return e.resendLostBegin(ctx, batch[0])
	}
	req := &idemgatev1.ReleaseLostBeginsRequest{LostBegins: make([]*idemgatev1.ReleaseLostBeginsRequest_LostBegin, len(batch))}
	for i, lb := range batch {
		req.LostBegins[i] = &idemgatev1.ReleaseLostBeginsRequest_LostBegin{Scope: lb.id.scope, Key: lb.id.key, AttemptToken: lb.id.token}
	}
	callCtx, cancel := context.WithTimeout(ctx, e.opts.DedupeTimeout)
	_, err := e.dedupe.ReleaseLostBegins(callCtx, req)
	cancel()
	if status.Code(err) == codes.Unimplemented {
		e.followUps.mu.Lock()
		e.followUps.oneByOne = true
		e.followUps.mu.Unlock()
		if len(batch) == 1 {
			return e.resendLostBegin(ctx, batch[0])
		}
	}
	return err
}

// resendLostBegin re-sends lb's Begin and releases what it finds reserved,
// within lb's deadline: the follow-up with a service of an earlier version.
func (e *Engine) resendLostBegin(ctx context.Context, lb *lostBegin) error {
	callCtx, cancel := context.WithTimeout(lb.c.withAgent(ctx), e.opts.DedupeTimeout)
	res, err := e.dedupe.Begin(callCtx, lb.req)
	cancel()
	if reserved := res.GetReserved(); err == nil && reserved != nil {
		lease := e.keepLease(lb.ctx, lb.c, reserved.GetEpoch(), 0, time.Now(), func() {})
		e.followUps.mu.Lock()
		deadline := lb.deadline
		e.followUps.mu.Unlock()
		e.releaseBy(lb.ctx, lb.c, reserved.GetEpoch(), false, lease, deadline)
	}
	return err
}

// nextFollowUps takes the first lost Begins in line still within their
// budget (giving up those past it), a batch of them (one when the service
// takes them one by one), and marks them in flight; none when none is
// left, and with last (none in flight) the goroutine must then stop. First
// in line is one a duplicate waits on, then the one whose lease runs out
// first, unless it failed while others got answers: that one lets the
// next go first, once.
func (e *Engine) nextFollowUps(last bool) []*lostBegin {
	f := &e.followUps
	f.mu.Lock()
	defer f.mu.Unlock()
	size := followUpBatch
	if f.oneByOne {
		size = 1
	}
	var batch []*lostBegin
	for f.queue.Len() > 0 && len(batch) < size {
		lb := heap.Pop(&f.queue).(*lostBegin)
		if lb.failedUp && f.queue.Len() > 0 {
			lb.failedUp = false
			next := heap.Pop(&f.queue).(*lostBegin)
			heap.Push(&f.queue, lb)
			lb = next
		}
		if time.Now().Before(lb.deadline) {
			lb.inFlight = true
			batch = append(batch, lb)
			continue
		}
		f.forget(lb)
		e.logLostFollowUp(lb, "the retry budget ran out")
	}
	if len(batch) == 0 && last {
		f.queue, f.running = nil, false
	}
	return batch
}

// followUpBackoffCap is the longest backoff step while the service does
// not answer: followUpMaxBackoff, or a quarter of the shortest lease
// waiting if less (at least followUpMinBackoff), so the follow-ups find the
// service back well within the lease it grants once back.
func (e *Engine) followUpBackoffCap() time.Duration {
	f := &e.followUps
	f.mu.Lock()
	defer f.mu.Unlock()
	limit := time.Duration(followUpMaxBackoff)
	for _, lb := range f.queue {
		limit = min(limit, lb.lease/4)
	}
	return max(limit, followUpMinBackoff)
}

// sleepOrWake waits d, less when wakeFollowUp is called; false when ctx
// ended.
func (e *Engine) sleepOrWake(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-e.followUps.wake:
		return true
	case <-ctx.Done():
		return false
	}
}

// requeueFollowUps puts batch back in line; failedUp says its call failed
// while others got answers.
func (e *Engine) requeueFollowUps(batch []*lostBegin, failedUp bool) {
	f := &e.followUps
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, lb := range batch {
		lb.inFlight, lb.again = false, false
		lb.failedUp = failedUp
		heap.Push(&f.queue, lb)
	}
}

// doneFollowUp forgets lb, followed up, unless it was lost again while in
// flight: then it goes last in line once more.
func (e *Engine) doneFollowUp(lb *lostBegin) {
	f := &e.followUps
	f.mu.Lock()
	defer f.mu.Unlock()
	if lb.again {
		lb.inFlight, lb.again = false, false
		heap.Push(&f.queue, lb)
		return
	}
	f.forget(lb)
}

// lostFollowUp gives lb up.
func (e *Engine) lostFollowUp(lb *lostBegin, why string) {
	f := &e.followUps
	f.mu.Lock()
	f.forget(lb)
	f.mu.Unlock()
	e.logLostFollowUp(lb, why)
}

// dropFollowUps gives up every queued lost Begin, and marks the goroutine
// stopped: Close's context ended. None is in flight.
func (e *Engine) dropFollowUps(why string) {
	f := &e.followUps
	f.mu.Lock()
	queue := f.queue
	f.queue, f.pending, f.keys, f.running = nil, nil, nil, false
	f.mu.Unlock()
	for _, lb := range queue {
		e.logLostFollowUp(lb, why)
	}
}

func (e *Engine) logLostFollowUp(lb *lostBegin, why string) {
	e.opts.Logger.ErrorContext(lb.ctx, "idemgate: could not follow up a Begin whose answer was lost ("+why+"); if it made a reservation, the key goes down its on_lost_outcome path when the lease runs out",
		slog.String("scope", lb.c.Scope))
}

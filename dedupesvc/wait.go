package dedupesvc

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/idemgate/idemgate/internal/grpcerr"
)

// waitMargin is kept from the caller's deadline, so a wait that runs out
// still answers in_flight instead of DEADLINE_EXCEEDED.
const waitMargin = 50 * time.Millisecond

// notifiedPollFactor stretches the poll interval while a healthy Notifier
// wakes waiters: polling is then only the fallback for a lost notification.
const notifiedPollFactor = 10

// Healthy is implemented by a Notifier that can tell whether its
// notifications currently arrive (pgstore.Listener: connected and
// listening). A Notifier that does not implement it counts as healthy.
type Healthy interface {
	// Healthy reports whether notifications arrive now.
	Healthy() bool
}

// keyWaits are the Begins waiting on in-flight keys: one keyWait per key,
// shared by all its waiters, so one wake-up and one store read serve them
// all.
type keyWaits struct {
	mu       sync.Mutex
	keys     map[RecordID]*keyWait
	total    int
	byCaller map[string]int
}

// keyWait is one in-flight key's waiters and the goroutine that watches it
// for them.
type keyWait struct {
	id      RecordID
	waiters map[*waiter]struct{} // guarded by keyWaits.mu
	stop    chan struct{}        // closed by retire
	retired bool                 // guarded by keyWaits.mu
}

// waiter is one waiting Begin. The watcher sends it at most one message:
// the shared answer, or nil for "the record changed: read it yourself".
type waiter struct {
	p        BeginParams
	deadline time.Time
	msg      chan *BeginResult
	kw       *keyWait // the watcher it is registered with; nil once answered
}

// wait waits until an in-flight key's outcome is known, the key is free for
// this attempt, or until (the Begin's arrival plus max_wait, within the
// caller's deadline). Waiters
// of one key share one watcher (watch), which alone subscribes, polls and
// re-reads; a waiter reads the store itself only when the watcher saw the
// record change in a way its answer depends on (the key became free or its
// fingerprint differs). Past the waiter caps it answers in_flight at once.
// It never answers later than its deadline: a store read is bounded by the
// time left.
func (s *Server) wait(ctx context.Context, p BeginParams, res BeginResult, until time.Time) (BeginResult, error) {
	deadline := until
	if d, ok := ctx.Deadline(); ok && d.Add(-waitMargin).Before(deadline) {
		deadline = d.Add(-waitMargin)
	}
	w := &waiter{p: p, deadline: deadline}
	if !s.addWaiter(w) {
		s.opts.metrics.quota(QuotaWaiters)
		return res, nil
	}
	defer s.removeWaiter(w)
	s.waits.started.Add(1)
	s.opts.metrics.count(outcomeWaited)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for res.State == BeginInFlight {
		select {
		case <-timer.C:
			return res, nil
		case <-ctx.Done():
			return res, nil
		case shared := <-w.msg:
			if shared != nil {
				res = *shared
				continue
			}
		}
		next, err := s.readBounded(ctx, p, deadline)
		if err != nil {
			return res, err
		}
		res = next
		if res.State == BeginInFlight {
			s.rearm(w)
		}
	}
	s.waits.outcomes.Add(1)
	return res, nil
}

// readBounded is the waiter's own Begin, bounded by its deadline: a late
// store answer must not stretch max_wait. A Begin cut off by the deadline
// may still have reserved the key for this attempt, so the caller must not
// take it for in_flight: it gets UNAVAILABLE, and the interceptor re-sends
// the same Begin to learn the outcome (its lost-Begin follow-up).
func (s *Server) readBounded(ctx context.Context, p BeginParams, deadline time.Time) (BeginResult, error) {
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	res, err := s.store.Begin(rctx, p)
	if err != nil && rctx.Err() != nil && ctx.Err() == nil {
		return res, grpcerr.New(codes.Unavailable, ReasonStoreUnavailable,
			"the dedupe store did not answer within max_wait; the call is safe to retry with the same attempt token", nil, s.opts.storeRetryAfter)
	}
	return res, err
}

// addWaiter admits w under the waiter caps and registers it with its key's
// watcher, starting one for a key nobody waits on yet.
func (s *Server) addWaiter(w *waiter) bool {
	k := &s.keys
	id := w.p.ID()
	k.mu.Lock()
	defer k.mu.Unlock()
	held := k.byCaller[id.Namespace]
	if k.total >= s.opts.maxWaiters || held >= s.opts.maxCallerWaiters {
		return false
	}
	// The pool's last places are kept for callers that hold few waiters,
	// so that callers at their own cap cannot fill it for everyone else.
	reserve, share := waiterReserve(s.opts.maxWaiters, s.opts.maxCallerWaiters)
	if k.total >= s.opts.maxWaiters-reserve && held >= share {
		return false
	}
	if k.keys == nil {
		k.keys, k.byCaller = map[RecordID]*keyWait{}, map[string]int{}
	}
	k.total++
	k.byCaller[id.Namespace]++
	s.register(w)
	return true
}

// waiterReserve is the part of a pool of total waiters kept for callers
// holding fewer than share waiters each: a tenth of the pool, at most one
// caller's cap, at least one; share is a tenth of the reserve, at least one.
// At the defaults (10,000 and 1,000) 1,000 places are kept, 100 for each
// caller, so ten callers at their cap of 1,000 can no longer fill the pool:
// 9,000 of theirs wait, and a bystander's Begins still do.
func waiterReserve(total, perCaller int) (reserve, share int) {
	reserve = max(1, min(perCaller, total/10))
	return reserve, max(1, reserve/10)
}

// register adds w to its key's watcher, starting one for a key nobody
// watches. keyWaits.mu must be held.
func (s *Server) register(w *waiter) {
	k := &s.keys
	id := w.p.ID()
	w.msg = make(chan *BeginResult, 1)
	kw, ok := k.keys[id]
	if !ok {
		kw = &keyWait{id: id, waiters: map[*waiter]struct{}{}, stop: make(chan struct{})}
		k.keys[id] = kw
		go s.watch(kw, w.p)
	}
	kw.waiters[w] = struct{}{}
	w.kw = kw
}

// retire stops kw's watcher and forgets it. keyWaits.mu must be held.
func (s *Server) retire(kw *keyWait) {
	if kw.retired {
		return
	}
	kw.retired = true
	close(kw.stop)
	if s.keys.keys[kw.id] == kw {
		delete(s.keys.keys, kw.id)
	}
}

// rearm registers w again after its own read found the key still in flight.
func (s *Server) rearm(w *waiter) {
	k := &s.keys
	k.mu.Lock()
	defer k.mu.Unlock()
	s.register(w)
}

// removeWaiter unregisters w, stopping its key's watcher if it was the
// last, and frees its place under the caps.
func (s *Server) removeWaiter(w *waiter) {
	k := &s.keys
	id := w.p.ID()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.total--
	if k.byCaller[id.Namespace]--; k.byCaller[id.Namespace] <= 0 {
		delete(k.byCaller, id.Namespace)
	}
	if kw := w.kw; kw != nil {
		delete(kw.waiters, w)
		if len(kw.waiters) == 0 {
			s.retire(kw)
		}
	}
}

// watch is the one goroutine that watches an in-flight key for its waiters:
// it subscribes once, wakes on a notification or the (jittered) poll timer,
// and re-reads the record once for all of them, read-only (Peek). An
// unchanged in-flight record costs nothing more; a stored outcome (or a
// record marked unknown) is handed to every waiter of the same request; any
// other change tells each waiter to read for itself.
func (s *Server) watch(kw *keyWait, p BeginParams) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-kw.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	var wake <-chan struct{}
	if s.opts.notifier != nil {
		ch, unsubscribe := s.opts.notifier.Subscribe(ctx, kw.id)
		defer unsubscribe()
		wake = ch
	}
	probe := p
	probe.Peek, probe.AttemptToken = true, ""
	timer := time.NewTimer(s.pollInterval())
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
			s.waits.notified.Add(1)
		case <-timer.C:
			s.waits.polled.Add(1)
		}
		timer.Reset(s.pollInterval())
		// Bounded by the latest waiter's deadline: nobody waits for a
		// later answer.
		rctx, rcancel := context.WithDeadline(ctx, s.latestDeadline(kw))
		res, err := s.store.Begin(rctx, probe)
		rcancel()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
				s.opts.logger.WarnContext(ctx, "re-reading a waited-for record failed; waiters keep waiting", "error", err)
			}
			continue
		}
		if res.State == BeginInFlight {
			continue
		}
		s.deliver(kw, probe, res)
		return
	}
}

// deliver hands a settled record's answer to every waiter of kw (and
// unregisters them): the answer itself when it holds for the waiter (the
// same request's stored outcome or unknown outcome), else nil, which makes
// the waiter read for itself.
func (s *Server) deliver(kw *keyWait, probe BeginParams, res BeginResult) {
	shareable := res.State == BeginCompleted || res.State == BeginOutcomeUnknown
	k := &s.keys
	k.mu.Lock()
	defer k.mu.Unlock()
	for w := range kw.waiters {
		var msg *BeginResult
		if shareable && bytes.Equal(w.p.Fingerprint, probe.Fingerprint) {
			msg = &res
		}
		w.msg <- msg // buffered, and sent once per registration
		w.kw = nil
	}
	// A Begin that comes to wait after this starts a watcher of its own,
	// whose subscription finds the record settled at once.
	s.retire(kw)
}

// latestDeadline is when the last of kw's waiters gives up.
func (s *Server) latestDeadline(kw *keyWait) time.Time {
	s.keys.mu.Lock()
	defer s.keys.mu.Unlock()
	latest := time.Now()
	for w := range kw.waiters {
		if w.deadline.After(latest) {
			latest = w.deadline
		}
	}
	return latest
}

// pollInterval is the watcher's next poll: the configured interval, ten
// times it while a healthy Notifier wakes waiters, jittered by ±20% so the
// watchers of many keys do not poll in step.
func (s *Server) pollInterval() time.Duration {
	d := s.opts.pollInterval
	if n := s.opts.notifier; n != nil {
		if h, ok := n.(Healthy); !ok || h.Healthy() {
			d *= notifiedPollFactor
		}
	}
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

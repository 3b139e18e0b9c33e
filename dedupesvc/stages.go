package dedupesvc

import (
	"context"
	"time"
)

// Stages of a Begin or a Finish, the stage label of
// idemgate_dedupe_stage_seconds: where a call's time inside the service goes.
// Together they add up to idemgate_dedupe_rpc_duration_seconds.
const (
	// StageChecks is the request's checks before the store: its fields,
	// the caller's rate, sealing an outcome.
	StageChecks = "checks"
	// StageQueue is the time a statement waited for a group-commit writer
	// (pgstore, sqlitestore) before it was sent.
	StageQueue = "queue"
	// StageStatement is the time from sending a group-commit batch to its
	// answer: the round trip, the statements and the commit.
	StageStatement = "statement"
	// StageStore is the rest of the store's time: statements outside group
	// commit (a takeover, a re-read), waiting for a resume mark, and the
	// store's own code.
	StageStore = "store"
	// StageWait is a Begin's wait for an in-flight outcome (max_wait).
	StageWait = "wait"
	// StageReply is the time after the store: opening a sealed outcome,
	// building the answer, counting it.
	StageReply = "reply"
)

var allStages = []string{StageChecks, StageQueue, StageStatement, StageStore, StageWait, StageReply}

// StageTimer collects the stage times of one call. The service puts one in
// the context it passes to the Store (WithStageTimer); a store that batches
// adds the time each statement queued and took. Its methods do nothing on a
// nil *StageTimer, so a store calls them whether or not anyone measures.
type StageTimer struct {
	start, storeStart, storeEnd, waitEnd time.Time
	queue, statement                     time.Duration
}

type stageTimerKey struct{}

// WithStageTimer returns ctx carrying t, for a Store to add its stages to.
func WithStageTimer(ctx context.Context, t *StageTimer) context.Context {
	return context.WithValue(ctx, stageTimerKey{}, t)
}

// StageTimerFrom returns the StageTimer of ctx, nil when the call is not
// measured.
func StageTimerFrom(ctx context.Context) *StageTimer {
	t, _ := ctx.Value(stageTimerKey{}).(*StageTimer)
	return t
}

// AddStatement adds one statement's wait for a writer (queued) and its round
// trip (took) to the call's stages.
func (t *StageTimer) AddStatement(queued, took time.Duration) {
	if t != nil {
		t.queue += queued
		t.statement += took
	}
}

// startStages starts timing a call when the service has metrics, and
// returns ctx with the timer for the store; nil when unmeasured.
func (m *Metrics) startStages(ctx context.Context) (context.Context, *StageTimer) {
	if m == nil {
		return ctx, nil
	}
	t := &StageTimer{start: time.Now()}
	return WithStageTimer(ctx, t), t
}

func (t *StageTimer) storeStarted() {
	if t != nil {
		t.storeStart = time.Now()
	}
}

func (t *StageTimer) storeEnded() {
	if t != nil {
		t.storeEnd = time.Now()
	}
}

func (t *StageTimer) waitEnded() {
	if t != nil {
		t.waitEnd = time.Now()
	}
}

// observeStages records the stages of a call that ended now. A call refused
// before the store (a bad request, the rate) is all checks.
func (m *Metrics) observeStages(rpc string, t *StageTimer) {
	if m == nil || t == nil {
		return
	}
	end := time.Now()
	observe := func(stage string, d time.Duration) {
		m.stages.WithLabelValues(rpc, stage).Observe(max(d, 0).Seconds())
	}
	if t.storeStart.IsZero() {
		observe(StageChecks, end.Sub(t.start))
		return
	}
	storeEnd := t.storeEnd
	if storeEnd.IsZero() {
		storeEnd = end
	}
	observe(StageChecks, t.storeStart.Sub(t.start))
	observe(StageQueue, t.queue)
	observe(StageStatement, t.statement)
	observe(StageStore, storeEnd.Sub(t.storeStart)-t.queue-t.statement)
	replyFrom := storeEnd
	if !t.waitEnd.IsZero() {
		observe(StageWait, t.waitEnd.Sub(storeEnd))
		replyFrom = t.waitEnd
	}
	observe(StageReply, end.Sub(replyFrom))
}

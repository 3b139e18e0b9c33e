package gatecore

import (
	"sync/atomic"
	"time"
)

// Event labels: what a gate did that its caller does not see.
const (
	EventFenced           = "fenced"
	EventFinishRetry      = "finish_retry"
	EventOutcomeLost      = "outcome_lost"
	EventReleaseRetry     = "release_retry"
	EventReleaseFailure   = "release_failure"
	EventHeartbeatFailure = "heartbeat_failure"
	EventReconciled       = "reconciled"
	EventResultTooLarge   = "result_too_large"
	EventBeginLost        = "begin_lost"
	EventReplayCacheHit   = "replay_cache_hit"
	EventReplayCacheMiss  = "replay_cache_miss"
)

// Stats counts the events since the Engine was built, one field per event.
type Stats struct {
	Fenced, FinishRetries, OutcomesLost, ReleaseRetries, ReleaseFailures, HeartbeatFailures int64
	Reconciled, TooLarge, LostBegins, ReplayCacheHits, ReplayCacheMisses                    int64
}

type counters struct {
	fenced, finishRetries, outcomesLost, releaseRetries, releaseFailures, heartbeatFailures, reconciled, tooLarge, lostBegins atomic.Int64
	replayCacheHits, replayCacheMisses                                                                                        atomic.Int64
}

func (c *counters) of(event string) *atomic.Int64 {
	switch event {
	case EventFenced:
		return &c.fenced
	case EventFinishRetry:
		return &c.finishRetries
	case EventOutcomeLost:
		return &c.outcomesLost
	case EventReleaseRetry:
		return &c.releaseRetries
	case EventReleaseFailure:
		return &c.releaseFailures
	case EventHeartbeatFailure:
		return &c.heartbeatFailures
	case EventReconciled:
		return &c.reconciled
	case EventBeginLost:
		return &c.lostBegins
	case EventReplayCacheHit:
		return &c.replayCacheHits
	case EventReplayCacheMiss:
		return &c.replayCacheMisses
	default:
		return &c.tooLarge
	}
}

// Stats returns the counters.
func (e *Engine) Stats() Stats {
	return Stats{
		Fenced:            e.counts.fenced.Load(),
		FinishRetries:     e.counts.finishRetries.Load(),
		OutcomesLost:      e.counts.outcomesLost.Load(),
		ReleaseRetries:    e.counts.releaseRetries.Load(),
		ReleaseFailures:   e.counts.releaseFailures.Load(),
		HeartbeatFailures: e.counts.heartbeatFailures.Load(),
		Reconciled:        e.counts.reconciled.Load(),
		TooLarge:          e.counts.tooLarge.Load(),
		LostBegins:        e.counts.lostBegins.Load(),
		ReplayCacheHits:   e.counts.replayCacheHits.Load(),
		ReplayCacheMisses: e.counts.replayCacheMisses.Load(),
	}
}

// Event counts an event of the call c and tells Options.OnEvent.
func (e *Engine) Event(c *Call, event string) {
	e.counts.of(event).Add(1)
	if e.opts.OnEvent != nil {
		e.opts.OnEvent(c.Label, event)
	}
}

// Stages of a gated call, for Options.OnStage.
const (
	// StagePrepare is the front end's work before Begin: reading the key,
	// naming the scope, fingerprinting the request.
	StagePrepare = "prepare"
	// StageBegin is the Begin round trip to the Dedupe service.
	StageBegin = "begin"
	// StageHandler is the handler's run with the front end's reading of its
	// answer (Transport.Run: classifying it, encoding the outcome).
	StageHandler = "handler"
	// StageFinish is storing the outcome before the caller is answered
	// (FINISH_POLICY_BEFORE_REPLY; after the reply it is not the caller's
	// time and is not observed).
	StageFinish = "finish"
)

// Stage tells Options.OnStage that c spent d in stage.
func (e *Engine) Stage(c *Call, stage string, d time.Duration) {
	if e.opts.OnStage != nil {
		e.opts.OnStage(c.Label, stage, d)
	}
}

package interceptor

import "sync/atomic"

// Stats counts what the interceptor did that a caller cannot see, so nothing
// is dropped silently. Read it with Gate.Stats.
type Stats struct {
	// Fenced counts heartbeats and Finishes refused because the attempt had
	// lost its reservation (its lease ran out and the record was taken over
	// or marked outcome-unknown). The refused outcome never overwrote a
	// newer one.
	Fenced int64
	// FinishRetries counts Finish attempts repeated after the Dedupe service
	// could not take an outcome.
	FinishRetries int64
	// OutcomesLost counts side effects whose outcome was never stored: the
	// Finish retries ran out, or the handler panicked. Their records go down
	// the on_lost_outcome path.
	OutcomesLost int64
	// ReleaseFailures counts handler errors whose reservation could not be
	// released; the key stays in flight until its lease runs out.
	ReleaseFailures int64
	// HeartbeatFailures counts heartbeats that did not reach the Dedupe
	// service (a fenced one counts in Fenced instead).
	HeartbeatFailures int64
	// Reconciled counts lost outcomes a Reconciler settled.
	Reconciled int64
	// TooLarge counts outcomes over the size limit, stored as a marker.
	TooLarge int64
}

type counters struct {
	fenced, finishRetries, outcomesLost, releaseFailures, heartbeatFailures, reconciled, tooLarge atomic.Int64
}

// Stats returns the counters since the Gate was built.
func (g *Gate) Stats() Stats {
	return Stats{
		Fenced:            g.counts.fenced.Load(),
		FinishRetries:     g.counts.finishRetries.Load(),
		OutcomesLost:      g.counts.outcomesLost.Load(),
		ReleaseFailures:   g.counts.releaseFailures.Load(),
		HeartbeatFailures: g.counts.heartbeatFailures.Load(),
		Reconciled:        g.counts.reconciled.Load(),
		TooLarge:          g.counts.tooLarge.Load(),
	}
}

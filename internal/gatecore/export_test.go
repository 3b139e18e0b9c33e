package gatecore

// The follow-ups' backoff, for the tests that bound their Begins.
const (
	FollowUpMinBackoff = followUpMinBackoff
	FollowUpMaxBackoff = followUpMaxBackoff
)

// Closing reports whether Close began.
func (e *Engine) Closing() bool {
	e.backgroundMu.Lock()
	defer e.backgroundMu.Unlock()
	return e.closing
}

// FollowUpBatch is the follow-ups' batch size, for the tests that count
// their calls.
const FollowUpBatch = followUpBatch

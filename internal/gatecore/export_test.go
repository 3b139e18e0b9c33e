package gatecore

// The follow-ups' backoff, for the tests that bound their Begins.
const (
	FollowUpMinBackoff = followUpMinBackoff
	FollowUpMaxBackoff = followUpMaxBackoff
)

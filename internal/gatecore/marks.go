package gatecore

import "github.com/idemgate/idemgate/internal/vocab"

// A handler marks its error to say what it means for the record, whatever
// its code (idemgate.FinalError and its siblings, which every front end
// re-exports); Marked reads the mark as the Verdict it asks for.

// Marked returns the verdict a handler marked err with and the error it
// wrapped, or ok false when err carries no mark.
func Marked(err error) (v Verdict, unwrapped error, ok bool) {
	m, inner, ok := vocab.Marked(err)
	if !ok {
		return 0, err, false
	}
	switch m {
	case vocab.Final:
		return VerdictOutcome, inner, true
	case vocab.Retryable:
		return VerdictNotRun, inner, true
	case vocab.OutcomeUnknown:
		return VerdictUnknown, inner, true
	}
	return 0, err, false
}

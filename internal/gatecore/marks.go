package gatecore

import (
	"errors"

	"google.golang.org/grpc/status"
)

// A handler marks its error to say what it means for the record, whatever
// its code; every front end re-exports these (idemgate.FinalError,
// mcpgate.FinalError, ...).

// markedError carries a handler's decision on what its error means. It
// keeps the wrapped error's gRPC status, so the mark never changes what the
// caller receives.
type markedError struct {
	err     error
	verdict Verdict
}

func (e *markedError) Error() string { return e.err.Error() }

func (e *markedError) Unwrap() error { return e.err }

// GRPCStatus is the wrapped error's status.
func (e *markedError) GRPCStatus() *status.Status { return status.Convert(e.err) }

// MarkFinal marks err as the action's final outcome: stored and replayed.
func MarkFinal(err error) error { return mark(err, VerdictOutcome) }

// MarkRetryable marks err as not an outcome: the side effect certainly did
// not happen, so the key is released and a retry runs.
func MarkRetryable(err error) error { return mark(err, VerdictNotRun) }

// MarkOutcomeUnknown marks err as leaving the side effect's outcome unknown.
func MarkOutcomeUnknown(err error) error { return mark(err, VerdictUnknown) }

func mark(err error, v Verdict) error {
	if err == nil {
		return nil
	}
	return &markedError{err: err, verdict: v}
}

// Marked returns the verdict a handler marked err with and the error it
// wrapped, or ok false when err carries no mark.
func Marked(err error) (v Verdict, unwrapped error, ok bool) {
	var m *markedError
	if errors.As(err, &m) {
		return m.verdict, m.err, true
	}
	return 0, err, false
}

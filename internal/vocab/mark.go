package vocab

import (
	"errors"

	"google.golang.org/grpc/status"
)

// Mark is what a handler says its error means for the record, whatever its
// code.
type Mark int

const (
	// Final: the action's final outcome, stored and replayed
	// (idemgate.FinalError).
	Final Mark = iota + 1
	// Retryable: not an outcome, the side effect certainly did not happen,
	// so the key is released (idemgate.RetryableError).
	Retryable
	// OutcomeUnknown: the side effect's outcome is unknown
	// (idemgate.OutcomeUnknownError).
	OutcomeUnknown
)

// markedError carries a handler's mark. It keeps the wrapped error's gRPC
// status, so the mark never changes what the caller receives.
type markedError struct {
	err  error
	mark Mark
}

func (e *markedError) Error() string { return e.err.Error() }

func (e *markedError) Unwrap() error { return e.err }

// GRPCStatus is the wrapped error's status.
func (e *markedError) GRPCStatus() *status.Status { return status.Convert(e.err) }

// MarkError returns err marked with m; a nil err stays nil.
func MarkError(err error, m Mark) error {
	if err == nil {
		return nil
	}
	return &markedError{err: err, mark: m}
}

// Marked returns the mark err carries (the outermost, anywhere in its
// chain) and the error it wrapped, or ok false when err carries none.
func Marked(err error) (m Mark, unwrapped error, ok bool) {
	var me *markedError
	if errors.As(err, &me) {
		return me.mark, me.err, true
	}
	return 0, err, false
}

package interceptor

import (
	"context"
	"errors"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// errorKind is what a handler error means for the record.
type errorKind int

const (
	// errRetryable: the side effect did not happen; the key is released.
	errRetryable errorKind = iota
	// errFinal: the error is the action's outcome; it is stored and replayed.
	errFinal
	// errUnknown: the handler cannot tell whether the side effect happened.
	errUnknown
)

// markedError carries a handler's explicit decision on what its error means.
// It keeps the wrapped error's gRPC status.
type markedError struct {
	err  error
	kind errorKind
}

func (e *markedError) Error() string { return e.err.Error() }

func (e *markedError) Unwrap() error { return e.err }

// GRPCStatus keeps the wrapped error's status, so the mark never changes what
// the caller receives.
func (e *markedError) GRPCStatus() *status.Status { return status.Convert(e.err) }

// FinalError marks a handler error as the action's final outcome, whatever
// the method's replay_codes say: it is stored and replayed, details and all,
// to every duplicate. Return it when the side effect was decided (a card
// declined by the provider) and running again must not happen.
func FinalError(err error) error {
	if err == nil {
		return nil
	}
	return &markedError{err: err, kind: errFinal}
}

// RetryableError marks a handler error as not an outcome, whatever the
// method's replay_codes and unknown_codes say: the key is released and a
// retry runs again. Return it only when the side effect certainly did not
// happen (the provider refused the request before acting on it).
//
// An unmarked error whose code is in neither replay_codes nor the unknown
// class (see OutcomeUnknownError) is treated the same way: by default
// UNKNOWN (a plain Go error), INTERNAL, UNAVAILABLE, INVALID_ARGUMENT and the
// rest release the key. If your provider client reports a failure after it
// sent the request with one of those, wrap it in OutcomeUnknownError or list
// its code in unknown_codes.
func RetryableError(err error) error {
	if err == nil {
		return nil
	}
	return &markedError{err: err, kind: errRetryable}
}

// OutcomeUnknownError marks a handler error as leaving the side effect's
// outcome unknown, whatever its code: the provider's client timed out or
// lost its connection after sending the request. The key is never freed by
// it: under FAIL_CLOSED the record becomes outcome-unknown at once and the
// caller, and every duplicate, gets FAILED_PRECONDITION
// (IDEMPOTENCY_OUTCOME_UNKNOWN) until the record is resolved or a Reconciler
// settles it; under REEXECUTE the key is freed for the next call, as after a
// lost lease. Errors that wrap context.DeadlineExceeded or context.Canceled,
// and errors with the codes DEADLINE_EXCEEDED, CANCELLED or the method's
// unknown_codes, are treated so without the mark.
func OutcomeUnknownError(err error) error {
	if err == nil {
		return nil
	}
	return &markedError{err: err, kind: errUnknown}
}

// Reconciler is asked, when a call finds that an earlier attempt's outcome
// was lost (its lease ran out mid-call), what really happened: a payment
// provider can be asked whether a charge with this key exists. req is the
// call's request. An error leaves the outcome unknown.
type Reconciler func(ctx context.Context, key string, req proto.Message) (Resolution, error)

// Resolution is a Reconciler's answer.
type Resolution struct {
	kind     resolutionKind
	response proto.Message
	err      error
}

type resolutionKind int

const (
	stillUnknown resolutionKind = iota
	resolvedResponse
	resolvedError
	resolvedNotRun
)

// ResolvedResponse says the side effect happened and resp is what the method
// would have returned. It is stored and replayed like a response.
func ResolvedResponse(resp proto.Message) Resolution {
	return Resolution{kind: resolvedResponse, response: resp}
}

// ResolvedError says the action ended with a final error, which is stored and
// replayed like a response.
func ResolvedError(err error) Resolution {
	return Resolution{kind: resolvedError, err: err}
}

// ResolvedNotRun says the side effect did not happen: the record is released
// and the call runs the handler.
func ResolvedNotRun() Resolution {
	return Resolution{kind: resolvedNotRun}
}

// StillUnknown says the reconciler cannot tell; the caller gets
// IDEMPOTENCY_OUTCOME_UNKNOWN.
func StillUnknown() Resolution {
	return Resolution{kind: stillUnknown}
}

// classify decides what a handler error means and returns its status and
// the error to hand back (the mark removed). A mark decides first, then
// replay_codes, then the unknown class (context errors, DEADLINE_EXCEEDED,
// CANCELLED, unknown_codes); any other error frees the key.
func (m *gatedMethod) classify(err error) (kind errorKind, st *status.Status, unwrapped error) {
	var marked *markedError
	if errors.As(err, &marked) {
		return marked.kind, status.Convert(marked.err), marked.err
	}
	st = status.Convert(err)
	switch {
	case m.replay[st.Code()]:
		return errFinal, st, err
	case m.unknown[st.Code()], errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return errUnknown, st, err
	}
	return errRetryable, st, err
}

package interceptor

import (
	"context"
	"errors"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// markedError carries a handler's explicit decision on whether its error is
// a final outcome. It keeps the wrapped error's gRPC status.
type markedError struct {
	err   error
	final bool
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
	return &markedError{err: err, final: true}
}

// RetryableError marks a handler error as not an outcome, whatever the
// method's replay_codes say: the key is released and a retry runs again.
// Return it when the side effect certainly did not happen.
func RetryableError(err error) error {
	if err == nil {
		return nil
	}
	return &markedError{err: err, final: false}
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

// finalStatus decides whether a handler error is a final outcome and returns
// its status and the error to hand back (the mark removed).
func (m *gatedMethod) finalStatus(err error) (final bool, st *status.Status, unwrapped error) {
	var marked *markedError
	if errors.As(err, &marked) {
		return marked.final, status.Convert(marked.err), marked.err
	}
	st = status.Convert(err)
	return m.replay[st.Code()], st, err
}

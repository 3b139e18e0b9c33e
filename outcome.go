package idemgate

import (
	"context"

	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate/internal/vocab"
)

// FinalError marks a handler error as the action's final outcome, whatever
// the method's replay_codes say: it is stored and replayed, details and all,
// to every duplicate. Return it when the side effect was decided (a card
// declined by the provider) and running again must not happen.
func FinalError(err error) error {
	return vocab.MarkError(err, vocab.Final)
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
	return vocab.MarkError(err, vocab.Retryable)
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
	return vocab.MarkError(err, vocab.OutcomeUnknown)
}

// Reconciler is asked, when a call finds that an earlier attempt's outcome
// was lost (its lease ran out mid-call), what really happened: a payment
// provider can be asked whether a charge with this key exists. req is the
// call's request. An error leaves the outcome unknown: the caller gets
// IDEMPOTENCY_OUTCOME_UNKNOWN. A ResolvedResponse of a type other than the
// method's response leaves it unknown too, and the caller gets INTERNAL (a
// bug in the reconciler, logged). interceptor.WithReconciler and
// connectgate.WithReconciler take the same type, so one reconciler serves a
// method over gRPC and over Connect.
type Reconciler func(ctx context.Context, key string, req proto.Message) (Resolution, error)

// Resolution is a Reconciler's answer; build it with ResolvedResponse,
// ResolvedError, ResolvedNotRun or StillUnknown. Its zero value is
// StillUnknown's.
type Resolution = vocab.Resolution

// ResolvedResponse says the side effect happened and resp is what the method
// would have returned. It is stored and replayed like a response.
func ResolvedResponse(resp proto.Message) Resolution {
	return vocab.Resolve(vocab.ResolvedResponse, resp, nil)
}

// ResolvedError says the action ended with a final error, which is stored and
// replayed like a response.
func ResolvedError(err error) Resolution {
	return vocab.Resolve(vocab.ResolvedError, nil, err)
}

// ResolvedNotRun says the side effect did not happen: the record is released
// and the call runs the handler.
func ResolvedNotRun() Resolution {
	return vocab.Resolve(vocab.ResolvedNotRun, nil, nil)
}

// StillUnknown says the reconciler cannot tell; the caller gets
// IDEMPOTENCY_OUTCOME_UNKNOWN.
func StillUnknown() Resolution {
	return vocab.Resolve(vocab.StillUnknown, nil, nil)
}

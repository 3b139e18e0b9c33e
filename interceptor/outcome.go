package interceptor

import (
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/gatecore"
)

// FinalError marks a handler error as the action's final outcome, whatever
// the method's replay_codes say.
//
// Deprecated: use idemgate.FinalError, its home shared by every gate.
func FinalError(err error) error { return idemgate.FinalError(err) }

// RetryableError marks a handler error as not an outcome: the key is
// released and a retry runs again.
//
// Deprecated: use idemgate.RetryableError, its home shared by every gate.
func RetryableError(err error) error { return idemgate.RetryableError(err) }

// OutcomeUnknownError marks a handler error as leaving the side effect's
// outcome unknown, whatever its code.
//
// Deprecated: use idemgate.OutcomeUnknownError, its home shared by every
// gate.
func OutcomeUnknownError(err error) error { return idemgate.OutcomeUnknownError(err) }

// Reconciler is asked what really happened to a lost outcome.
//
// Deprecated: use idemgate.Reconciler, its home shared by every gate.
type Reconciler = idemgate.Reconciler

// Resolution is a Reconciler's answer.
//
// Deprecated: use idemgate.Resolution, its home shared by every gate.
type Resolution = idemgate.Resolution

// ResolvedResponse says the side effect happened and resp is what the method
// would have returned.
//
// Deprecated: use idemgate.ResolvedResponse, its home shared by every gate.
func ResolvedResponse(resp proto.Message) Resolution { return idemgate.ResolvedResponse(resp) }

// ResolvedError says the action ended with a final error.
//
// Deprecated: use idemgate.ResolvedError, its home shared by every gate.
func ResolvedError(err error) Resolution { return idemgate.ResolvedError(err) }

// ResolvedNotRun says the side effect did not happen.
//
// Deprecated: use idemgate.ResolvedNotRun, its home shared by every gate.
func ResolvedNotRun() Resolution { return idemgate.ResolvedNotRun() }

// StillUnknown says the reconciler cannot tell.
//
// Deprecated: use idemgate.StillUnknown, its home shared by every gate.
func StillUnknown() Resolution { return idemgate.StillUnknown() }

// classify decides what a handler error means (protogate's Classify, on
// its gRPC status).
func (m *gatedMethod) classify(err error) (verdict gatecore.Verdict, st *status.Status, unwrapped error) {
	return m.Classify(err, status.Convert)
}

package gatetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
)

// The methods of ConformanceService, by their short names: the method
// argument of Handler and Client.Call.
const (
	// MethodCharge fails closed, lease 4s, max_wait 0.
	MethodCharge = "Charge"
	// MethodChargeWait fails closed, lease 4s, max_wait 10s.
	MethodChargeWait = "ChargeWait"
	// MethodChargeReexecute is REEXECUTE, lease 3s, max_wait 0.
	MethodChargeReexecute = "ChargeReexecute"
	// MethodChargeAfterReply is FINISH_POLICY_AFTER_REPLY, lease 4s,
	// max_wait 10s.
	MethodChargeAfterReply = "ChargeAfterReply"
	// MethodChargeBounded has an execution_timeout of 1s, lease 4s,
	// max_wait 0.
	MethodChargeBounded = "ChargeBounded"
	// MethodChargeReplayErrors stores FAILED_PRECONDITION errors as final
	// outcomes (replay_codes), lease 4s, max_wait 0.
	MethodChargeReplayErrors = "ChargeReplayErrors"
)

// Methods lists every method an adapter serves, in the proto's order.
var Methods = []string{MethodCharge, MethodChargeWait, MethodChargeReexecute, MethodChargeAfterReply, MethodChargeBounded, MethodChargeReplayErrors}

// NewGate starts one gate of the adapter under test for one case and
// returns a client of it; it arranges the gate's shutdown with t.Cleanup. A
// case may start two gates on one Dedupe service (two replicas of a tool
// server), each through its own proxy.
type NewGate func(t *testing.T, cfg Config) Client

// Config is what the suite gives a gate.
type Config struct {
	// Handler is the suite's handler: serve it behind every method of
	// ConformanceService (Methods), with the method's policy.
	Handler Handler
	// DedupeAddr is the Dedupe service's loopback address (host:port),
	// plaintext gRPC, through the suite's fault proxy. Dial it with
	// idemgate.DedupeServiceConfig, as in production.
	DedupeAddr string
	// ReplayCache turns the gate's replay cache on (a few hundred entries
	// are plenty). Defaults to false: off.
	ReplayCache bool
}

// Handler is the suite's tool: it runs req as method says and honours ctx
// as a production handler does. Its error is a *Failure, which the adapter
// turns into its transport's error and its gate's mark, or an error that
// wraps ctx's error (a provider call that ended with the context), which
// the adapter returns as it is.
type Handler func(ctx context.Context, method string, req *testingv1.ConformanceRequest) (*testingv1.ConformanceResponse, error)

// Client calls a gate's methods over its transport.
type Client interface {
	// Call calls method with req, sending key as the idempotency key (none
	// when key is ""), and reports what the client received. It never
	// fails the test: every outcome, a transport error included, is in the
	// Answer.
	Call(ctx context.Context, method, key string, req *testingv1.ConformanceRequest) Answer
}

// Answer is what a client received for one call.
type Answer struct {
	// Body is what the transport delivered, for byte-for-byte comparison:
	// for a response, its bytes as received without the replay mark (gRPC:
	// the marshalled message off the wire; MCP: the result's JSON without
	// _meta["io.idemgate/replayed"]); for an error, the error as the
	// transport carries it (gRPC: the google.rpc.Status, deterministically
	// marshalled; MCP: the result's JSON without the mark).
	Body []byte
	// Response is the decoded response; nil for an error.
	Response *testingv1.ConformanceResponse
	// Replayed is the transport's replay mark (gRPC: the
	// idempotency-replayed header; MCP: _meta["io.idemgate/replayed"]).
	Replayed bool
	// Code is the error's gRPC code (for MCP, _meta["io.idemgate/error"]
	// code, or the handler's Failure code); OK for a response.
	Code codes.Code
	// Reason is the google.rpc.ErrorInfo reason of a refusal (gRPC: status
	// details; MCP: _meta["io.idemgate/error"].reason); "" otherwise.
	Reason string
	// RetryAfter is the refusal's google.rpc.RetryInfo delay (MCP:
	// retryAfterSeconds); 0 when it has none.
	RetryAfter time.Duration
	// Err is the raw error, nil for a response. It wraps ErrUnsupported when
	// the adapter cannot express what the call needs.
	Err error
}

// String describes the answer for failure messages.
func (a Answer) String() string {
	if a.Err == nil {
		return fmt.Sprintf("response %v (replayed %v)", a.Response, a.Replayed)
	}
	return fmt.Sprintf("%v %s (retry after %v): %v", a.Code, a.Reason, a.RetryAfter, a.Err)
}

// ErrUnsupported is what an adapter's Answer.Err wraps when its gate cannot
// express a method's policy or a handler's mark; the error's text names
// what is missing ("mcpgate cannot express FINISH_POLICY_AFTER_REPLY"), and
// the case fails with it.
var ErrUnsupported = errors.New("gatetest: the gate cannot express this")

// FailureKind says what a handler's Failure means to the gate.
type FailureKind int

const (
	// Unmarked leaves the decision to the method's policy (replay_codes).
	Unmarked FailureKind = iota
	// Retryable marks the side effect as not having happened: the key is
	// released (idemgate.RetryableError).
	Retryable
	// Final marks the error as the action's outcome, stored and replayed
	// (idemgate.FinalError).
	Final
	// OutcomeUnknown marks the side effect as possibly done
	// (idemgate.OutcomeUnknownError).
	OutcomeUnknown
)

// String names the kind.
func (k FailureKind) String() string {
	switch k {
	case Retryable:
		return "retryable"
	case Final:
		return "final"
	case OutcomeUnknown:
		return "outcome-unknown"
	default:
		return "unmarked"
	}
}

// Failure is a handler error: the gRPC code and message the transport
// carries, and the mark the gate is given.
type Failure struct {
	// Kind is the mark.
	Kind FailureKind
	// Code is the error's gRPC code.
	Code codes.Code
	// Message names the execution that failed, so a replay can be told from
	// a fresh run.
	Message string
}

// Error returns the code and message.
func (f *Failure) Error() string { return f.Code.String() + ": " + f.Message }

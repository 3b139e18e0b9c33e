package idemgate

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// Policy is the resolved idemgate policy of one method (or procedure):
// what interceptor.Gate.Policy and connectgate.Gate.Policy return.
type Policy struct {
	// Gated reports whether calls are deduplicated: the method is marked
	// mutating and its idempotency_level does not say it is safe.
	Gated bool
	// Retention is how long an outcome is replayed.
	Retention time.Duration
	// Lease is how long a reservation is held without a heartbeat before it
	// counts as abandoned.
	Lease time.Duration
	// OnLostOutcome says what a call finds after an attempt lost its lease
	// without an outcome.
	OnLostOutcome idemgatev1.LostOutcomePolicy
	// ReplayCodes are the status codes whose errors are stored and replayed.
	ReplayCodes []codes.Code
	// MaxWait is how long a duplicate waits for an in-flight outcome.
	MaxWait time.Duration
	// KeylessFingerprint reports whether a call without a key is
	// deduplicated on its fingerprint (KEYLESS_POLICY_FINGERPRINT) instead
	// of refused.
	KeylessFingerprint bool
	// KeylessWindow is how long a keyless call is deduplicated.
	KeylessWindow time.Duration
	// ExecutionTimeout is the handler's deadline; the caller's own deadline
	// and cancellation do not reach the handler.
	ExecutionTimeout time.Duration
	// Action names the records' action: the policy's action, or the full
	// method name.
	Action string
	// UnknownCodes are the status codes, beyond DEADLINE_EXCEEDED and
	// CANCELLED, whose errors leave the outcome unknown instead of freeing
	// the key.
	UnknownCodes []codes.Code
	// FinishAfterReply reports whether the caller is answered before the
	// outcome is stored (FINISH_POLICY_AFTER_REPLY), the outcome then stored
	// in the background. False, the default, stores it first.
	FinishAfterReply bool
}

// String describes the policy as logged, for example
// "gated(action=/pkg.S/M, retention=24h0m0s, lease=10s, on_lost_outcome=fail_closed, replay_codes=[], unknown_codes=[], max_wait=3s, keyless=reject, execution_timeout=1m0s, finish=before_reply)"
// or "ungated".
func (p Policy) String() string {
	if !p.Gated {
		return "ungated"
	}
	onLost := "fail_closed"
	if p.OnLostOutcome == idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_REEXECUTE {
		onLost = "reexecute"
	}
	keyless := "reject"
	if p.KeylessFingerprint {
		keyless = "fingerprint(" + p.KeylessWindow.String() + ")"
	}
	finish := "before_reply"
	if p.FinishAfterReply {
		finish = "after_reply"
	}
	return fmt.Sprintf("gated(action=%s, retention=%s, lease=%s, on_lost_outcome=%s, replay_codes=[%s], unknown_codes=[%s], max_wait=%s, keyless=%s, execution_timeout=%s, finish=%s)",
		p.Action, p.Retention, p.Lease, onLost, codeNames(p.ReplayCodes), codeNames(p.UnknownCodes), p.MaxWait, keyless, p.ExecutionTimeout, finish)
}

func codeNames(cs []codes.Code) string {
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = grpcerr.CodeName(c)
	}
	return strings.Join(names, " ")
}

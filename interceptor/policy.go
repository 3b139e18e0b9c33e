package interceptor

import (
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/protogate"
)

// Policy defaults, used when a method's (idemgate.v1.policy) leaves a field
// unset.
const (
	// DefaultRetention is how long an outcome is replayed: 24h.
	DefaultRetention = protogate.DefaultRetention
	// DefaultLease is how long a reservation is held without a heartbeat
	// before it counts as abandoned: 10s. The interceptor renews it about
	// every third of the lease while the handler runs.
	DefaultLease = protogate.DefaultLease
	// DefaultMaxWait is how long a duplicate waits for an in-flight
	// original's outcome before it gets ABORTED: 3s.
	DefaultMaxWait = protogate.DefaultMaxWait
	// MaxMaxWait is the longest max_wait a policy may set: 60s.
	MaxMaxWait = protogate.MaxMaxWait
	// DefaultKeylessWindow is how long a keyless call is deduplicated under
	// KEYLESS_POLICY_FINGERPRINT when the policy sets no window: 60s.
	DefaultKeylessWindow = protogate.DefaultKeylessWindow
	// MinLease is the shortest lease a policy may set: 1s.
	MinLease = protogate.MinLease
	// MaxRetention is the longest retention a policy may set: 365 days.
	MaxRetention = protogate.MaxRetention
	// MaxLease is the longest lease a policy may set: 24h, the longest the
	// Dedupe service renews a lease to.
	MaxLease = protogate.MaxLease
	// DefaultExecutionTimeout bounds a handler's run when the policy sets no
	// execution_timeout: 60s.
	DefaultExecutionTimeout = protogate.DefaultExecutionTimeout
	// MinExecutionTimeout and MaxExecutionTimeout bound execution_timeout:
	// 1s and 24h.
	MinExecutionTimeout = protogate.MinExecutionTimeout
	MaxExecutionTimeout = protogate.MaxExecutionTimeout
	// MaxActionBytes is the longest action name a policy may set: 255 bytes.
	MaxActionBytes = protogate.MaxActionBytes
)

// Policy is the resolved idemgate policy of one method.
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
func (p Policy) String() string { return protogate.Policy(p).String() }

// gatedMethod is what the interceptor needs at call time, resolved once
// (protogate, which connectgate shares), and its policy as this package
// spells it.
type gatedMethod struct {
	*protogate.Method
	policy Policy
	// mapped: its response can hold a map field (Gate.checkCodec).
	mapped bool
}

// fingerprint hashes the request as the Dedupe service compares it.
func (m *gatedMethod) fingerprint(req proto.Message) ([]byte, error) { return m.Fingerprint(req) }

// resolved is every method's classification, read once from descriptors.
type resolved struct {
	gated map[string]*gatedMethod
	// unclassified lists methods neither marked mutating nor declared safe
	// by idempotency_level: a policy decision nobody made.
	unclassified []string
	// services holds the full name of every service the descriptors know.
	services map[string]bool
}

// resolvePolicies resolves every method in files (protogate.Resolve).
func resolvePolicies(files *protoregistry.Files, types *protoregistry.Types, reconcilers map[string]Reconciler) (resolved, error) {
	r, err := protogate.Resolve(files, types, reconcilers)
	if err != nil {
		return resolved{}, err
	}
	gated := make(map[string]*gatedMethod, len(r.Gated))
	for name, m := range r.Gated {
		gated[name] = &gatedMethod{Method: m, policy: Policy(m.Policy), mapped: protogate.HasMap(m.Output.Descriptor())}
	}
	return resolved{gated: gated, unclassified: r.Unclassified, services: r.Services}, nil
}

package interceptor

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemgate/idemgate"
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

// gatedMethod is what the interceptor needs at call time, resolved once
// (protogate, which connectgate shares), and its policy as this package
// spells it.
type gatedMethod struct {
	*protogate.Method
	policy idemgate.Policy
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
func resolvePolicies(files *protoregistry.Files, types *protoregistry.Types, reconcilers map[string]idemgate.Reconciler) (resolved, error) {
	r, err := protogate.Resolve(files, types, reconcilers)
	if err != nil {
		return resolved{}, err
	}
	gated := make(map[string]*gatedMethod, len(r.Gated))
	for name, m := range r.Gated {
		gated[name] = &gatedMethod{Method: m, policy: m.Policy, mapped: protogate.HasMap(m.Output.Descriptor())}
	}
	return resolved{gated: gated, unclassified: r.Unclassified, services: r.Services}, nil
}

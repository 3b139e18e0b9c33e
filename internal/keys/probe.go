package keys

// ProbeScope and ProbeKey name the record the interceptor's start-up check
// (Gate.CheckDedupe) renews: one Heartbeat that crosses the network, the
// Dedupe service's authentication and validation and reads its store. No
// gated call uses this scope (a scope is a full method name or an action,
// never a bare word with a dot and no slash), so the record never exists
// and the service answers "not held". The service knows the pair and does
// not count that answer as a fenced renewal: a probe is no outcome.
const (
	ProbeScope = "idemgate.probe"
	ProbeKey   = "idemgate-probe"
)

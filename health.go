package idemgate

import "github.com/idemgate/idemgate/internal/gatecore"

// DedupeHealthService is the service name under which a gate's WatchDedupe
// reports the Dedupe service's health on the tool server's gRPC health
// service: SERVING while gated calls can reach it, NOT_SERVING while they
// cannot.
const DedupeHealthService = gatecore.DedupeHealthService

// HealthSetter is the part of *health.Server (google.golang.org/grpc/health)
// a gate's WatchDedupe uses.
type HealthSetter = gatecore.HealthSetter

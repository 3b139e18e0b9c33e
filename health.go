package idemgate

import healthpb "google.golang.org/grpc/health/grpc_health_v1"

// DedupeHealthService is the service name under which a gate's WatchDedupe
// reports the Dedupe service's health on the tool server's gRPC health
// service: SERVING while gated calls can reach it, NOT_SERVING while they
// cannot.
const DedupeHealthService = "idemgate.dedupe"

// HealthSetter is the part of *health.Server (google.golang.org/grpc/health)
// a gate's WatchDedupe uses.
type HealthSetter interface {
	SetServingStatus(service string, servingStatus healthpb.HealthCheckResponse_ServingStatus)
}

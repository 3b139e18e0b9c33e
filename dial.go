package idemgate

import "google.golang.org/grpc"

// DedupeServiceConfig is the gRPC service config every gate's connection to
// the Dedupe service needs (DialDedupe sets it): it retries every Dedupe
// RPC on UNAVAILABLE with backoff, which is safe because each of them is
// idempotent, and spreads the RPCs round robin over every address the
// target resolves to (several replicas behind one DNS name), skipping
// those that are down. Pass it with grpc.WithDefaultServiceConfig when you
// dial the service yourself.
const DedupeServiceConfig = `{
  "loadBalancingConfig": [{"round_robin": {}}],
  "methodConfig": [{
    "name": [{"service": "idemgate.v1.DedupeService"}],
    "retryPolicy": {
      "maxAttempts": 4,
      "initialBackoff": "0.05s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

// DialDedupe returns a client connection to the Dedupe service at target
// (such as "dns:///dedupe.internal:50051") with DedupeServiceConfig, for
// any gate: pass the connection to the gate's New through
// idemgatev1.NewDedupeServiceClient and to its WithDedupeConn. opts must
// name the transport credentials (grpc.WithTransportCredentials: TLS, or
// insecure on loopback), and may add per-RPC credentials such as a bearer
// token; there is no default, so plaintext is never chosen by omission.
// Like grpc.NewClient it does not connect until the first RPC.
func DialDedupe(target string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return grpc.NewClient(target, append([]grpc.DialOption{grpc.WithDefaultServiceConfig(DedupeServiceConfig)}, opts...)...)
}

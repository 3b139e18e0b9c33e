package interceptor

import (
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate/internal/gatecore"
)

// classify decides what a handler error means (protogate's Classify, on
// its gRPC status).
func (m *gatedMethod) classify(err error) (verdict gatecore.Verdict, st *status.Status, unwrapped error) {
	return m.Classify(err, status.Convert)
}

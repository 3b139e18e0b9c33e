package mcpwire

import (
	"testing"


	"google.golang.org/grpc/codes"

	"github.com/idemgate/idemgate/internal/gatecore"
)

// A key reused with other arguments is escalated, as the gRPC callers'
// table says: advice to mint a new key would have an agent loop run the
// side effect again.
func TestKeyReusedIsEscalated(t *testing.T) {
	if a := Advice(gatecore.ReasonKeyReused, codes.FailedPrecondition); a != AdviceEscalate {
		t.Errorf("advice for %s = %q, want %q", gatecore.ReasonKeyReused, a, AdviceEscalate)
	}
}

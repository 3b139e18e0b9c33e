package idemgate_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The gates of the other transports, and the MCP bridge, share the
// protocol's names through this package, never through the gRPC gate: an
// adopter of httpgate, mcpgate or connectgate does not link package
// interceptor, and no gate depends on another's. Without it each of them
// imported interceptor for its context accessors, header names and reasons.
func TestNoGateImportsTheGRPCGate(t *testing.T) {
	t.Parallel()
	for _, pkg := range []string{"httpgate", "mcpgate", "connectgate", "internal/mcpbridge"} {
		out, err := exec.Command("go", "list", "-deps", "./"+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps ./%s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == "github.com/idemgate/idemgate/interceptor" {
				t.Errorf("%s depends on package interceptor; take the shared names from package idemgate", pkg)
			}
		}
	}
}

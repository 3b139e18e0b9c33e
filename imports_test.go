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

// The root package is the vocabulary the gates build on, so it must not
// stand on them: a handler that imports only idemgate links no engine, and
// gatecore (the lifecycle engine) imports idemgate, never the other way. It
// may use these packages of this module, each a leaf (it imports no other
// package of this module):
var vocabularyDeps = map[string]bool{
	// The protos' Go code: Policy.OnLostOutcome is a LostOutcomePolicy.
	"github.com/idemgate/idemgate/gen/idemgate/v1": true,
	// The google.rpc.Code spelling of codes that Policy.String writes, the
	// same one the policies are written in.
	"github.com/idemgate/idemgate/internal/grpcerr": true,
	// What idemgate's exported names create or read but do not show: the
	// call a handler's context carries, the mark on a handler's error, a
	// Reconciler's answer. gatecore and protogate read their insides, and
	// Go shares unexported state only within a package, so it lives in a
	// leaf both sides import.
	"github.com/idemgate/idemgate/internal/vocab": true,
}

func TestVocabularyIsALeaf(t *testing.T) {
	t.Parallel()
	const module = "github.com/idemgate/idemgate"
	deps := func(pkg string) []string {
		t.Helper()
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		var own []string
		for _, dep := range strings.Fields(string(out)) {
			if dep != pkg && (dep == module || strings.HasPrefix(dep, module+"/")) {
				own = append(own, dep)
			}
		}
		return own
	}
	for _, dep := range deps(module) {
		if !vocabularyDeps[dep] {
			t.Errorf("package idemgate depends on %s; the vocabulary must not stand on the machinery (gatecore imports idemgate, not the reverse)", dep)
			continue
		}
		if own := deps(dep); len(own) > 0 {
			t.Errorf("package idemgate depends on %s, which is no longer a leaf: it imports %v", dep, own)
		}
	}
}

package protoset_test

import (
	"testing"

	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemgate/idemgate/internal/protoset"
)

// The set stands on its own: every import comes before the file that needs
// it, and a registry built from the set alone knows the service and the
// error details a caller decodes.
func TestCallersIsSelfContained(t *testing.T) {
	set, err := protoset.Callers()
	if err != nil {
		t.Fatal(err)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatalf("the set does not stand on its own: %v", err)
	}
	for _, name := range []string{
		"examples.payments.v1.PaymentsService", "google.rpc.Status", "google.rpc.ErrorInfo", "google.rpc.RetryInfo",
		"idemgate.v1.policy", "google.protobuf.Duration", "google.protobuf.Any",
	} {
		if _, err := files.FindDescriptorByName(protoreflect.FullName(name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	seen := map[string]bool{}
	for _, f := range set.GetFile() {
		for _, dep := range f.GetDependency() {
			if !seen[dep] {
				t.Errorf("%s comes before its import %s", f.GetName(), dep)
			}
		}
		if seen[f.GetName()] {
			t.Errorf("%s is in the set twice", f.GetName())
		}
		seen[f.GetName()] = true
	}
}

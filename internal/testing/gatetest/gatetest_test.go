package gatetest

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// TestMethodsAreTheService pins Methods to ConformanceService: every method
// listed, in order, each gated by a policy.
func TestMethodsAreTheService(t *testing.T) {
	sd := testingv1.File_idemgate_testing_v1_conformance_proto.Services().ByName("ConformanceService")
	var names []string
	for i := range sd.Methods().Len() {
		md := sd.Methods().Get(i)
		names = append(names, string(md.Name()))
		if p, _ := proto.GetExtension(md.Options(), idemgatev1.E_Policy).(*idemgatev1.MethodPolicy); !p.GetMutating() {
			t.Errorf("%s is not gated (mutating)", md.Name())
		}
	}
	if !slices.Equal(names, Methods) {
		t.Fatalf("Methods = %v, want the service's %v", Methods, names)
	}
}

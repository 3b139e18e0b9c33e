package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// What make protos-export writes, without buf: the descriptor set, which
// loads on its own and names the service and the error details, and the
// .proto sources of proto/ but the test services, byte for byte.
func TestExportWritesTheSetAndTheSources(t *testing.T) {
	dir := t.TempDir()
	set := filepath.Join(dir, "idemgate-callers.binpb")
	if err := run(set, "../../../proto", dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(set)
	if err != nil {
		t.Fatal(err)
	}
	var fds descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &fds); err != nil {
		t.Fatal(err)
	}
	files, err := protodesc.NewFiles(&fds)
	if err != nil {
		t.Fatalf("the exported set does not load: %v", err)
	}
	for _, name := range []string{"examples.payments.v1.PaymentsService", "google.rpc.Status", "google.rpc.ErrorInfo", "google.rpc.RetryInfo", "idemgate.v1.policy"} {
		if _, err := files.FindDescriptorByName(protoreflect.FullName(name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}

	var got []string
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(p) != ".proto" {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		got = append(got, filepath.ToSlash(rel))
		want, err := os.ReadFile(filepath.Join("../../../proto", rel))
		if err != nil {
			return err
		}
		if b, _ := os.ReadFile(p); !bytes.Equal(b, want) {
			t.Errorf("%s differs from proto/%s", rel, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"examples/payments/v1/payments.proto",
		"idemgate/v1/admin.proto",
		"idemgate/v1/dedupe.proto",
		"idemgate/v1/outcome.proto",
		"idemgate/v1/policy.proto",
	}
	if !slices.Equal(got, want) {
		t.Errorf("exported %q, want %q", got, want)
	}
}

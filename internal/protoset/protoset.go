// Package protoset builds the descriptor set a caller in another language
// needs to call the example payments tool and read idemgate's errors: the
// service's files, their imports, and google/rpc status and error_details,
// taken from the descriptors linked into this binary (so from the Go module
// cache, with no network and no .proto sources of googleapis).
//
// The set is a google.protobuf.FileDescriptorSet, which grpcurl (-protoset),
// protoc (--descriptor_set_in), Python's descriptor_pool and
// @grpc/proto-loader (loadFileDescriptorSetFromBuffer) all read.
package protoset

import (
	"fmt"

	_ "google.golang.org/genproto/googleapis/rpc/errdetails" // registers google/rpc/error_details.proto
	_ "google.golang.org/genproto/googleapis/rpc/status"     // registers google/rpc/status.proto
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	_ "github.com/idemgate/idemgate/gen/examples/payments/v1" // registers examples/payments/v1/payments.proto
)

// CallerFiles are the files Callers starts from; their imports come along.
var CallerFiles = []string{
	"examples/payments/v1/payments.proto",
	"google/rpc/status.proto",
	"google/rpc/error_details.proto",
}

// Callers returns the descriptor set of CallerFiles and everything they
// import.
func Callers() (*descriptorpb.FileDescriptorSet, error) {
	return Build(protoregistry.GlobalFiles, CallerFiles...)
}

// Build returns the descriptor set of the named files of files and of every
// file they import, each once, a file after its imports (the order protoc
// writes and every reader accepts).
func Build(files *protoregistry.Files, paths ...string) (*descriptorpb.FileDescriptorSet, error) {
	set := &descriptorpb.FileDescriptorSet{}
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := range imports.Len() {
			add(imports.Get(i).FileDescriptor)
		}
		set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
	}
	for _, path := range paths {
		fd, err := files.FindFileByPath(path)
		if err != nil {
			return nil, fmt.Errorf("protoset: %s is not linked into this binary: %w", path, err)
		}
		add(fd)
	}
	return set, nil
}

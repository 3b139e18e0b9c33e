package mcpbridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"google.golang.org/grpc"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// LoadDescriptorSet reads a FileDescriptorSet (buf build -o, protoc
// --descriptor_set_out; with imports, or without when the missing ones are
// linked into this binary: the well-known types and idemgate/v1).
func LoadDescriptorSet(path string) (*protoregistry.Files, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("descriptor set: %w", err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("descriptor set %s: %w", path, err)
	}
	return NewFiles(set.GetFile())
}

// NewFiles builds a registry from file descriptors in any order, adding the
// imports that are missing from those linked into this binary.
func NewFiles(files []*descriptorpb.FileDescriptorProto) (*protoregistry.Files, error) {
	have := map[string]bool{}
	for _, f := range files {
		have[f.GetName()] = true
	}
	set := &descriptorpb.FileDescriptorSet{File: files}
	for i := 0; i < len(set.File); i++ {
		for _, dep := range set.File[i].GetDependency() {
			if have[dep] {
				continue
			}
			fd, err := protoregistry.GlobalFiles.FindFileByPath(dep)
			if err != nil {
				return nil, fmt.Errorf("descriptors: %s imports %s, which is neither given nor linked", set.File[i].GetName(), dep)
			}
			have[dep] = true
			set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
		}
	}
	files2, err := protodesc.NewFiles(set)
	if err != nil {
		return nil, fmt.Errorf("descriptors: %w", err)
	}
	return files2, nil
}

// LoadReflection reads the descriptors of every service conn's server lists
// through gRPC server reflection (grpc.reflection.v1).
func LoadReflection(ctx context.Context, conn grpc.ClientConnInterface) (*protoregistry.Files, error) {
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		return nil, fmt.Errorf("reflection: %w", err)
	}
	defer stream.CloseSend()
	ask := func(req *reflectionpb.ServerReflectionRequest) (*reflectionpb.ServerReflectionResponse, error) {
		if err := stream.Send(req); err != nil {
			if errors.Is(err, io.EOF) {
				_, err = stream.Recv() // the stream's real error
			}
			return nil, fmt.Errorf("reflection: %w", err)
		}
		resp, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("reflection: %w", err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			return nil, fmt.Errorf("reflection: %s", e.GetErrorMessage())
		}
		return resp, nil
	}
	resp, err := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	if err != nil {
		return nil, err
	}
	byName := map[string]*descriptorpb.FileDescriptorProto{}
	var order []string
	add := func(resp *reflectionpb.ServerReflectionResponse) error {
		for _, b := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
			fd := &descriptorpb.FileDescriptorProto{}
			if err := proto.Unmarshal(b, fd); err != nil {
				return fmt.Errorf("reflection: %w", err)
			}
			if byName[fd.GetName()] == nil {
				byName[fd.GetName()] = fd
				order = append(order, fd.GetName())
			}
		}
		return nil
	}
	for _, svc := range resp.GetListServicesResponse().GetService() {
		r, err := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: svc.GetName()}})
		if err != nil {
			return nil, err
		}
		if err := add(r); err != nil {
			return nil, err
		}
	}
	// The server sends each file once per stream, with the imports it has
	// not sent yet; ask for any still missing.
	for i := 0; i < len(order); i++ {
		for _, dep := range byName[order[i]].GetDependency() {
			if byName[dep] != nil {
				continue
			}
			if _, err := protoregistry.GlobalFiles.FindFileByPath(dep); err == nil {
				continue
			}
			r, err := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileByFilename{FileByFilename: dep}})
			if err != nil {
				return nil, err
			}
			if err := add(r); err != nil {
				return nil, err
			}
		}
	}
	files := make([]*descriptorpb.FileDescriptorProto, 0, len(order))
	for _, name := range order {
		files = append(files, byName[name])
	}
	return NewFiles(files)
}

// FileSet returns the FileDescriptorSet of fd and everything it imports,
// imports first: what a descriptor set file for fd's services holds.
func FileSet(fds ...protoreflect.FileDescriptor) *descriptorpb.FileDescriptorSet {
	set := &descriptorpb.FileDescriptorSet{}
	seen := map[string]bool{}
	var visit func(fd protoreflect.FileDescriptor)
	visit = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		for i := 0; i < fd.Imports().Len(); i++ {
			visit(fd.Imports().Get(i).FileDescriptor)
		}
		set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
	}
	for _, fd := range fds {
		visit(fd)
	}
	return set
}

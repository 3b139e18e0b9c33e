// Package mapsvc is a gated test service whose response is a map with many
// entries (google.protobuf.Struct, whose fields are a map<string, Value>),
// described at run time so the test protos need not change. The gates' tests
// call it to compare a first answer's wire bytes with its replays': an
// encoder that writes a map in Go's random order would make them differ.
package mapsvc

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

const (
	// Service is the service's full name.
	Service = "idemgate.testing.maps.v1.MapService"
	// Procedure is its one method, gated (mutating), as gRPC and Connect
	// name it: it takes and answers a google.protobuf.Struct.
	Procedure = "/" + Service + "/Tag"
	// Entries is how many map entries Answer puts in a response: enough
	// that two encodings in Go's random map order are all but never equal.
	Entries = 64
)

// Files returns a registry holding only the service's file, for a gate's
// WithFiles.
func Files() (*protoregistry.Files, error) {
	opts := &descriptorpb.MethodOptions{}
	proto.SetExtension(opts, idemgatev1.E_Policy, &idemgatev1.MethodPolicy{Mutating: true})
	fdp := &descriptorpb.FileDescriptorProto{
		Name:       proto.String("idemgate/testing/maps/v1/maps.proto"),
		Package:    proto.String("idemgate.testing.maps.v1"),
		Syntax:     proto.String("proto3"),
		Dependency: []string{"google/protobuf/struct.proto", "idemgate/v1/policy.proto"},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("MapService"), Method: []*descriptorpb.MethodDescriptorProto{{
			Name: proto.String("Tag"), InputType: proto.String(".google.protobuf.Struct"), OutputType: proto.String(".google.protobuf.Struct"),
			Options: opts,
		}}}},
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		return nil, err
	}
	files := &protoregistry.Files{}
	if err := files.RegisterFile(fd); err != nil {
		return nil, err
	}
	return files, nil
}

// Answer is the response to req: Entries string fields, each naming its
// index and the execution n, so a re-run would differ in content too.
func Answer(n int64) *structpb.Struct {
	s := &structpb.Struct{Fields: make(map[string]*structpb.Value, Entries)}
	for i := range Entries {
		s.Fields[fmt.Sprintf("k%02d", i)] = structpb.NewStringValue(fmt.Sprintf("value %d of execution %d", i, n))
	}
	return s
}

// Handler answers one call.
type Handler func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error)

// RegisterGRPC serves the service on s with h.
func RegisterGRPC(s grpc.ServiceRegistrar, h Handler) {
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: Service,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Tag", Handler: func(_ any, ctx context.Context, dec func(any) error, intercept grpc.UnaryServerInterceptor) (any, error) {
			in := &structpb.Struct{}
			if err := dec(in); err != nil {
				return nil, err
			}
			run := func(ctx context.Context, req any) (any, error) { return h(ctx, req.(*structpb.Struct)) }
			if intercept == nil {
				return run(ctx, in)
			}
			return intercept(ctx, in, &grpc.UnaryServerInfo{Server: h, FullMethod: Procedure}, run)
		}}},
		Metadata: "idemgate/testing/maps/v1/maps.proto",
	}, h)
}

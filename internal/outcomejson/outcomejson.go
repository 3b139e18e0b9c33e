// Package outcomejson reads the descriptor sets operators give their tools
// (a serialized google.protobuf.FileDescriptorSet, as buf build -o
// set.binpb or protoc --descriptor_set_out --include_imports writes) and
// converts a stored outcome, a google.protobuf.Any, to and from protobuf
// JSON with the types linked into the binary and those of the set:
// idemctl's -descriptors and the operator console's -console-descriptors
// read and use them alike.
package outcomejson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/anypb"
)

// MaxFileBytes bounds a descriptor set file: a set with every import of a
// large API is a few megabytes; a file much larger is not one.
const MaxFileBytes = 64 << 20

// ReadFile reads the FileDescriptorSet at path and links its files, each
// import included (a set written without --include_imports fails here,
// naming the missing file). setting names the flag or field in the errors.
func ReadFile(setting, path string) (*protoregistry.Files, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", setting, err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", setting, err)
	}
	if len(raw) > MaxFileBytes {
		return nil, fmt.Errorf("%s %s is over %d bytes: not a FileDescriptorSet", setting, path, MaxFileBytes)
	}
	set := &descriptorpb.FileDescriptorSet{}
	if err := proto.Unmarshal(raw, set); err != nil {
		return nil, fmt.Errorf("%s %s is not a FileDescriptorSet (buf build -o set.binpb, or protoc --descriptor_set_out --include_imports): %w", setting, path, err)
	}
	// Any bytes may parse as an empty set (a text file often does): a set
	// without files describes nothing and is refused as not a set.
	if len(set.GetFile()) == 0 {
		return nil, fmt.Errorf("%s %s is not a FileDescriptorSet (buf build -o set.binpb, or protoc --descriptor_set_out --include_imports): it holds no file", setting, path)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w (a set written without its imports? protoc needs --include_imports)", setting, path, err)
	}
	return files, nil
}

// Resolver finds message and extension types by name or type URL: what
// protojson needs to read and write the Any fields inside a message.
type Resolver interface {
	protoregistry.MessageTypeResolver
	protoregistry.ExtensionTypeResolver
}

// Types returns the types linked into the binary (protoregistry.GlobalTypes:
// idemgate's own, google.rpc's, the well-known ones), then those of files
// when files is not nil.
func Types(files *protoregistry.Files) Resolver {
	c := chain{protoregistry.GlobalTypes}
	if files != nil {
		c = append(c, dynamicpb.NewTypes(files))
	}
	return c
}

// chain asks each resolver in turn.
type chain []Resolver

func (c chain) FindMessageByName(name protoreflect.FullName) (protoreflect.MessageType, error) {
	for _, r := range c {
		if mt, err := r.FindMessageByName(name); err == nil {
			return mt, nil
		}
	}
	return nil, protoregistry.NotFound
}

func (c chain) FindMessageByURL(url string) (protoreflect.MessageType, error) {
	for _, r := range c {
		if mt, err := r.FindMessageByURL(url); err == nil {
			return mt, nil
		}
	}
	return nil, protoregistry.NotFound
}

func (c chain) FindExtensionByName(name protoreflect.FullName) (protoreflect.ExtensionType, error) {
	for _, r := range c {
		if xt, err := r.FindExtensionByName(name); err == nil {
			return xt, nil
		}
	}
	return nil, protoregistry.NotFound
}

func (c chain) FindExtensionByNumber(message protoreflect.FullName, field protoreflect.FieldNumber) (protoreflect.ExtensionType, error) {
	for _, r := range c {
		if xt, err := r.FindExtensionByNumber(message, field); err == nil {
			return xt, nil
		}
	}
	return nil, protoregistry.NotFound
}

// ErrUnknownMethod is what ResponseType's errors are (errors.Is) when
// files do not describe the method: its service is not in them, or has no
// such method, or the name is not a method's.
var ErrUnknownMethod = errors.New("unknown method")

// methodError says which part of a method is missing; it is
// ErrUnknownMethod.
type methodError string

func (e methodError) Error() string        { return string(e) }
func (e methodError) Is(target error) bool { return target == ErrUnknownMethod }

// ResponseType returns the response message of method, a full gRPC method
// name ("/pkg.Service/Method"), as files describe it. Its errors say what
// is missing, and each is ErrUnknownMethod (errors.Is).
func ResponseType(files *protoregistry.Files, method string) (protoreflect.MessageDescriptor, error) {
	service, name, ok := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	if !ok || !strings.HasPrefix(method, "/") || service == "" || name == "" {
		return nil, methodError(fmt.Sprintf("%q is not a full method name (/pkg.Service/Method)", method))
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(service))
	sd, isService := d.(protoreflect.ServiceDescriptor)
	if err != nil || !isService {
		return nil, methodError(fmt.Sprintf("service %s is not in the descriptors", service))
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil {
		return nil, methodError(fmt.Sprintf("service %s has no method %s", service, name))
	}
	return md.Output(), nil
}

// FromJSON parses text as the protobuf JSON of the message md describes
// (its Any fields' types found through resolver; unknown fields refused)
// and packs it as the Any the interceptor stores for such a response: type
// URL type.googleapis.com/<full name>, value marshalled deterministically.
func FromJSON(md protoreflect.MessageDescriptor, text []byte, resolver Resolver) (*anypb.Any, error) {
	msg := dynamicpb.NewMessage(md)
	if err := (protojson.UnmarshalOptions{Resolver: resolver}).Unmarshal(text, msg); err != nil {
		return nil, fmt.Errorf("not a valid %s: %w", md.FullName(), err)
	}
	outcome := &anypb.Any{}
	if err := anypb.MarshalFrom(outcome, msg, proto.MarshalOptions{Deterministic: true}); err != nil {
		return nil, err
	}
	return outcome, nil
}

// ToJSON decodes a, its type found through resolver, to protobuf JSON
// indented by two spaces, laid out the same way every time (protojson
// varies its whitespace on purpose; json.Indent drops that). It returns the
// type's full name too. A type resolver does not know is an error wrapping
// protoregistry.NotFound.
func ToJSON(a *anypb.Any, resolver Resolver) ([]byte, protoreflect.FullName, error) {
	mt, err := resolver.FindMessageByURL(a.GetTypeUrl())
	if err != nil {
		return nil, "", fmt.Errorf("type %s: %w", a.GetTypeUrl(), err)
	}
	msg := mt.New().Interface()
	if err := proto.Unmarshal(a.GetValue(), msg); err != nil {
		return nil, "", err
	}
	compact, err := protojson.MarshalOptions{Resolver: resolver}.Marshal(msg)
	if err != nil {
		return nil, "", err
	}
	var text bytes.Buffer
	if err := json.Indent(&text, compact, "", "  "); err != nil {
		return nil, "", err
	}
	return text.Bytes(), mt.Descriptor().FullName(), nil
}

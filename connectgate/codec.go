package connectgate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// codecOptions are the deterministic codecs HandlerOptions installs under
// connect-go's codec names, so a first answer and its replays carry one
// response in the same bytes: the binary protobuf codec ("proto", also
// what the gRPC and gRPC-Web protocols send) marshals with
// MarshalOptions{Deterministic: true}, which writes map fields in key order
// (connect-go's writes them in Go's random map order); the JSON codecs
// ("json", "json; charset=utf-8") are protojson compacted, since protojson
// sorts map keys but varies its spacing from one binary to another, so a
// replay from another build of the tool server would differ.
func codecOptions() []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithCodec(deterministicProto{}),
		connect.WithCodec(compactJSON{name: "json"}),
		connect.WithCodec(compactJSON{name: "json; charset=utf-8"}),
	}
}

// deterministicProto is connect-go's binary protobuf codec, deterministic.
type deterministicProto struct{}

func (deterministicProto) Name() string { return "proto" }

func (c deterministicProto) Marshal(v any) ([]byte, error) { return c.MarshalAppend(nil, v) }

// MarshalAppend lets connect-go reuse its buffers, as with its own codec.
func (deterministicProto) MarshalAppend(dst []byte, v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, notProto(v)
	}
	return proto.MarshalOptions{Deterministic: true}.MarshalAppend(dst, m)
}

func (deterministicProto) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return notProto(v)
	}
	if err := proto.Unmarshal(data, m); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", v, err)
	}
	return nil
}

// compactJSON is connect-go's protobuf JSON codec with its output compacted.
type compactJSON struct{ name string }

func (c compactJSON) Name() string { return c.name }

func (compactJSON) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, notProto(v)
	}
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// Unmarshal discards unknown fields, as connect-go's JSON codec does, so a
// client on a newer schema is not refused.
func (compactJSON) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return notProto(v)
	}
	if len(data) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, m); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", v, err)
	}
	return nil
}

func notProto(v any) error {
	return fmt.Errorf("%T does not implement proto.Message", v)
}

package dedupeapp

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	protov2 "google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// requestCodec is the server's codec: protobuf, except that a request that
// does not parse (truncated, a string not UTF-8) is the caller's fault,
// INVALID_ARGUMENT (DEDUPE_REQUEST_INVALID), not the INTERNAL grpc-go makes
// of any codec error, which alerts would read as a server fault.
//
// grpc-go turns whatever error Unmarshal returns into INTERNAL, so Unmarshal
// succeeds with an empty message and notes the error; the interceptors,
// first in their chains, take the note and refuse the call before anything
// sees the message. Every note is taken by the interceptor of its call,
// also when the call fails after the message was read, so none outlives it.
type requestCodec struct {
	encoding.CodecV2
	malformed sync.Map // message pointer -> parse error
}

func newRequestCodec() *requestCodec {
	return &requestCodec{CodecV2: encoding.GetCodecV2(proto.Name)}
}

func (c *requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(protov2.Message)
	if !ok {
		return err
	}
	protov2.Reset(m)
	c.malformed.Store(v, err)
	return nil
}

// refusal returns the INVALID_ARGUMENT for msg if it did not parse, and
// forgets it.
func (c *requestCodec) refusal(msg any) error {
	parseErr, ok := c.malformed.LoadAndDelete(msg)
	if !ok {
		return nil
	}
	name := "the request"
	if m, ok := msg.(protov2.Message); ok {
		name = string(m.ProtoReflect().Descriptor().FullName())
	}
	return grpcerr.New(codes.InvalidArgument, dedupesvc.ReasonInvalidRequest,
		fmt.Sprintf("the request is not a valid %s: %v", name, parseErr), nil, 0)
}

func (c *requestCodec) unaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := c.refusal(req); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

func (c *requestCodec) streamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, checkedStream{ServerStream: ss, codec: c})
	}
}

// checkedStream refuses a stream message that did not parse.
type checkedStream struct {
	grpc.ServerStream
	codec *requestCodec
}

func (s checkedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	// The note goes whatever RecvMsg answers: for a request that is not a
	// client stream grpc-go reads on after the one message, to see the
	// request end, and a stream reset there fails RecvMsg after the codec
	// noted a malformed message. Kept, the note and the message would stay
	// for the life of the process.
	refusal := s.codec.refusal(m)
	if err != nil {
		return err
	}
	return refusal
}

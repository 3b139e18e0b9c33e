package interceptor

import (
	"context"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemgate/idemgate"
)

type outgoingKey struct{}

// WithKey returns a context whose gated calls carry key as their idempotency
// key. The orchestration layer calls it once per logical action (an order,
// a message) and uses the context for every retry of that action; a key a
// model proposes is advisory and belongs in your own records, not here,
// unless you have checked it names this action.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, outgoingKey{}, key)
}

// IsReplayed reports whether response headers (grpc.Header) say the response
// is a stored outcome replayed instead of a fresh execution.
func IsReplayed(header metadata.MD) bool {
	v := header.Get(idemgate.ReplayedHeader)
	return len(v) == 1 && v[0] == "true"
}

// replayedOption is the CallOption Replayed returns.
type replayedOption struct {
	grpc.EmptyCallOption
	into *bool
}

// Replayed returns a CallOption that, with the Caller's interceptor
// installed, sets *into to whether the response was a replay.
func Replayed(into *bool) grpc.CallOption {
	return replayedOption{into: into}
}

// Caller attaches idempotency keys to a client's gated calls. Build it with
// NewCaller and install its UnaryClientInterceptor on the connection to the
// tool server.
type Caller struct {
	methods map[string]*gatedMethod
	mint    bool
}

type callerOptions struct {
	files *protoregistry.Files
	types *protoregistry.Types
	mint  bool
}

// CallerOption configures NewCaller.
type CallerOption func(*callerOptions)

// WithCallerFiles sets the registry searched for the gated methods. Defaults
// to protoregistry.GlobalFiles.
func WithCallerFiles(files *protoregistry.Files) CallerOption {
	return func(o *callerOptions) { o.files = files }
}

// WithMintedKeys makes the interceptor mint a key for a gated call whose
// context has none (see WithKey) and whose request carries none: a UUIDv7,
// time-ordered, made once per logical call and kept for every retry that
// happens below the interceptor. Defaults to off: such a call goes out
// without a key and the tool server refuses it, which is the safe default.
func WithMintedKeys() CallerOption {
	return func(o *callerOptions) { o.mint = true }
}

// NewCaller resolves which methods are gated from the descriptors, the same
// way New does for the server.
func NewCaller(opts ...CallerOption) (*Caller, error) {
	o := callerOptions{files: protoregistry.GlobalFiles, types: protoregistry.GlobalTypes}
	for _, opt := range opts {
		opt(&o)
	}
	r, err := resolvePolicies(o.files, o.types, nil)
	if err != nil {
		return nil, err
	}
	return &Caller{methods: r.gated, mint: o.mint}, nil
}

// UnaryClientInterceptor returns the client interceptor that attaches keys.
//
// Order matters when a retrying interceptor is chained too: put this one
// first (outside), so it runs once per logical call and every retry reuses
// its key. go-grpc-middleware's retry interceptor re-runs the interceptors
// chained after it on each attempt, so a minting interceptor placed after it
// mints a fresh key per attempt and defeats deduplication. grpc-go's own
// retries (the service config's retryPolicy) happen below every interceptor
// and always reuse the key.
func (c *Caller) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		m, gated := c.methods[method]
		if !gated {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		key, err := c.keyFor(ctx, m, req)
		if err != nil {
			return err
		}
		if key != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, key)
		}
		var (
			into   *bool
			header metadata.MD
		)
		for _, opt := range opts {
			if r, ok := opt.(replayedOption); ok {
				into = r.into
			}
		}
		if into != nil {
			opts = append(opts, grpc.Header(&header))
		}
		err = invoker(ctx, method, req, reply, cc, opts...)
		if into != nil {
			*into = IsReplayed(header)
		}
		return err
	}
}

// StreamClientInterceptor returns a stream interceptor that passes every
// stream through: no streaming method can be gated (see New), so there is
// no key to attach.
func (c *Caller) StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(ctx, desc, cc, method, opts...)
	}
}

// keyFor picks the key to send in the metadata: the context's, or a minted
// one. It sends none when the caller already put one in the metadata or in
// the request's key field.
func (c *Caller) keyFor(ctx context.Context, m *gatedMethod, req any) (string, error) {
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(idemgate.KeyHeader)) > 0 {
		return "", nil
	}
	if key, ok := ctx.Value(outgoingKey{}).(string); ok && key != "" {
		return key, nil
	}
	if msg, ok := req.(proto.Message); ok && m.KeyField() != nil && msg.ProtoReflect().Get(m.KeyField()).String() != "" {
		return "", nil
	}
	if !c.mint {
		return "", nil
	}
	id, err := uuid.NewV7()
	if err != nil {
		return "", status.Errorf(codes.Internal, "idemgate: mint an idempotency key: %v", err)
	}
	return id.String(), nil
}

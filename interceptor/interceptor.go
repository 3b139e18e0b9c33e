package interceptor

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/keys"
)

// Metadata names the interceptor reads and writes.
const (
	// KeyHeader is the request metadata that carries the idempotency key.
	KeyHeader = "idempotency-key"
	// ReplayedHeader is the response header set to "true" when the response
	// is a stored outcome replayed instead of a fresh execution.
	ReplayedHeader = "idempotency-replayed"
)

// DedupeServiceConfig is a gRPC service config for the client connection to
// the Dedupe service: it retries every Dedupe RPC on UNAVAILABLE with
// backoff, which is safe because each of them is idempotent. Pass it with
// grpc.WithDefaultServiceConfig.
const DedupeServiceConfig = `{
  "methodConfig": [{
    "name": [{"service": "idemgate.v1.DedupeService"}],
    "retryPolicy": {
      "maxAttempts": 4,
      "initialBackoff": "0.05s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

// Gate holds the resolved policies of every method and a client of the
// Dedupe service. It is safe for concurrent use.
type Gate struct {
	dedupe  idemgatev1.DedupeServiceClient
	methods map[string]*gatedMethod
	opts    options
}

// New resolves the policy of every method in the descriptor registry (see
// WithFiles) and returns a Gate that deduplicates the gated ones through
// dedupe. It fails, naming each method, when a policy is inconsistent: a
// method marked both mutating and NO_SIDE_EFFECTS, a streaming method marked
// mutating, or a lease or retention out of range.
func New(dedupe idemgatev1.DedupeServiceClient, opts ...Option) (*Gate, error) {
	if dedupe == nil {
		return nil, fmt.Errorf("idemgate: New needs a Dedupe service client, got nil")
	}
	o := defaultOptions
	for _, opt := range opts {
		opt(&o)
	}
	methods, err := resolvePolicies(o.files, o.types, o)
	if err != nil {
		return nil, err
	}
	return &Gate{dedupe: dedupe, methods: methods, opts: o}, nil
}

// Policy returns the resolved policy of a full method name
// ("/pkg.Service/Method"); a method it does not gate reports Gated false.
func (g *Gate) Policy(fullMethod string) Policy {
	if m, ok := g.methods[fullMethod]; ok {
		return m.policy
	}
	return Policy{}
}

// UnaryServerInterceptor returns the server interceptor that gates unary
// calls. Put it after authentication (the tenant function may read the
// caller's identity) and before anything that retries the handler.
func (g *Gate) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		m, ok := g.methods[info.FullMethod]
		if !ok {
			return handler(ctx, req)
		}
		return g.gate(ctx, req, info.FullMethod, m, handler)
	}
}

func (g *Gate) gate(ctx context.Context, req any, fullMethod string, m *gatedMethod, handler grpc.UnaryHandler) (any, error) {
	key, err := keyFromMetadata(ctx)
	if err != nil {
		return nil, err
	}
	tenant, err := g.opts.tenant(ctx)
	if err != nil {
		return nil, err
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idemgate: request of %s is %T, not a protobuf message", fullMethod, req)
	}
	fingerprint, err := fingerprintOf(msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemgate: fingerprint the request of %s: %v", fullMethod, err)
	}
	scope := scopeOf(fullMethod, tenant)
	token := rand.Text()

	beginCtx, cancel := context.WithTimeout(ctx, g.opts.dedupeTimeout)
	begun, err := g.dedupe.Begin(beginCtx, &idemgatev1.BeginRequest{
		Scope:        scope,
		Key:          key,
		Fingerprint:  fingerprint,
		AttemptToken: token,
		Lease:        durationpb.New(m.policy.Lease),
		Retention:    durationpb.New(m.policy.Retention),
	})
	cancel()
	if err != nil {
		return nil, g.beginError(ctx, err)
	}

	switch result := begun.GetResult().(type) {
	case *idemgatev1.BeginResponse_Reserved_:
		return g.run(ctx, req, key, scope, token, result.Reserved.GetEpoch(), handler)
	case *idemgatev1.BeginResponse_Completed_:
		return g.replay(ctx, m, result.Completed.GetOutcome())
	case *idemgatev1.BeginResponse_InFlight_:
		return nil, grpcerr.New(codes.Aborted, ReasonInFlight,
			"another call with this idempotency key is running now; retry with the same key to get its outcome",
			nil, g.opts.inFlightRetry)
	case *idemgatev1.BeginResponse_FingerprintMismatch_:
		return nil, grpcerr.New(codes.FailedPrecondition, ReasonKeyReused,
			"this idempotency key was first used with a different request; use a new key for a new action",
			nil, 0)
	default:
		return nil, grpcerr.New(codes.Internal, ReasonStoreRejected,
			fmt.Sprintf("the Dedupe service answered Begin with an unknown result %T", result), nil, 0)
	}
}

// run executes the handler under the reservation and records what happened.
// Recording is detached from the caller's context: a caller that timed out
// after the side effect ran must still leave its outcome behind.
func (g *Gate) run(ctx context.Context, req any, key, scope, token string, epoch int64, handler grpc.UnaryHandler) (any, error) {
	resp, handlerErr := handler(contextWithKey(ctx, key), req)
	recordCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.opts.outcomeTimeout)
	defer cancel()

	if handlerErr != nil {
		_, err := g.dedupe.Release(recordCtx, &idemgatev1.ReleaseRequest{Scope: scope, Key: key, AttemptToken: token, Epoch: epoch})
		if err != nil {
			g.opts.logger.ErrorContext(ctx, "idemgate: could not release the reservation after the handler failed; the key stays in flight until its lease ends",
				slog.String("scope", scope), slog.Int64("epoch", epoch), slog.Any("error", err))
		}
		return resp, handlerErr
	}

	respMsg, ok := resp.(proto.Message)
	if !ok {
		return resp, nil // grpc will fail to encode it anyway
	}
	outcome := &anypb.Any{}
	if err := anypb.MarshalFrom(outcome, respMsg, proto.MarshalOptions{Deterministic: true}); err != nil {
		g.opts.logger.ErrorContext(ctx, "idemgate: could not serialize the response to store it", slog.String("scope", scope), slog.Any("error", err))
		return resp, nil
	}
	_, err := g.dedupe.Finish(recordCtx, &idemgatev1.FinishRequest{Scope: scope, Key: key, AttemptToken: token, Epoch: epoch, Outcome: outcome})
	if err != nil {
		g.opts.logger.ErrorContext(ctx, "idemgate: could not store the outcome after the handler succeeded; the caller got the response",
			slog.String("scope", scope), slog.Int64("epoch", epoch), slog.Any("error", err))
	}
	return resp, nil
}

// replay returns the stored outcome as the method's response. A stored type
// that is not the response type is an error, never a reason to run again.
func (g *Gate) replay(ctx context.Context, m *gatedMethod, outcome *anypb.Any) (any, error) {
	if outcome.MessageName() != m.outputName {
		return nil, grpcerr.New(codes.Internal, ReasonOutcomeTypeMismatch,
			fmt.Sprintf("the stored outcome is a %s, not this method's response type %s; the call was not run again", outcome.MessageName(), m.outputName),
			nil, 0)
	}
	resp := m.output.New().Interface()
	if err := proto.Unmarshal(outcome.GetValue(), resp); err != nil {
		return nil, grpcerr.New(codes.Internal, ReasonOutcomeTypeMismatch,
			fmt.Sprintf("the stored outcome does not decode as %s: %v; the call was not run again", m.outputName, err), nil, 0)
	}
	if err := grpc.SetHeader(ctx, metadata.Pairs(ReplayedHeader, "true")); err != nil {
		g.opts.logger.WarnContext(ctx, "idemgate: could not set the replayed header", slog.Any("error", err))
	}
	return resp, nil
}

// beginError maps a failed Begin. The caller's own cancellation stays what it
// is; a Dedupe service that is down or overloaded fails closed as
// UNAVAILABLE; a Dedupe service that refused the request is a
// misconfiguration, INTERNAL.
func (g *Gate) beginError(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return status.FromContextError(ctxErr).Err()
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented, codes.OutOfRange:
		return grpcerr.New(codes.Internal, ReasonStoreRejected,
			"the Dedupe service refused the reservation: "+status.Convert(err).Message()+"; the handler did not run", nil, 0)
	default:
		return grpcerr.New(codes.Unavailable, ReasonStoreUnavailable,
			"the Dedupe service is unavailable, so the call was not run (fail closed); retry with the same idempotency key",
			nil, g.opts.storeRetry)
	}
}

// keyFromMetadata returns the idempotency key of the call, or the status
// error to refuse it with.
func keyFromMetadata(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(KeyHeader)
	if len(values) == 0 {
		return "", grpcerr.New(codes.InvalidArgument, ReasonKeyMissing,
			"this method has side effects and needs an idempotency key: send one in the "+KeyHeader+" metadata, minted once per logical action and reused on every retry of it",
			nil, 0)
	}
	key := values[0]
	for _, v := range values[1:] {
		if v != key {
			return "", grpcerr.New(codes.InvalidArgument, ReasonKeyInvalid,
				"the "+KeyHeader+" metadata has more than one value; send exactly one key", nil, 0)
		}
	}
	if err := keys.Validate(key); err != nil {
		return "", grpcerr.New(codes.InvalidArgument, ReasonKeyInvalid,
			"the idempotency key "+err.Error()+": use 1 to 255 bytes of printable ASCII, such as a UUID", nil, 0)
	}
	return key, nil
}

// fingerprintOf hashes the deterministic encoding of the request, so the same
// request always gives the same fingerprint within one binary.
func fingerprintOf(msg proto.Message) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

// scopeOf joins the method and the tenant. A full method name never holds
// "|", so the first "|" splits the two unambiguously.
func scopeOf(fullMethod, tenant string) string {
	if tenant == "" {
		return fullMethod
	}
	var b strings.Builder
	b.Grow(len(fullMethod) + 1 + len(tenant))
	b.WriteString(fullMethod)
	b.WriteByte('|')
	b.WriteString(tenant)
	return b.String()
}

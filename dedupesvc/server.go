package dedupesvc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/keys"
)

// Request limits the service enforces before it touches the store.
const (
	// MaxScopeBytes is the longest scope accepted.
	MaxScopeBytes = 1024
	// MaxAttemptTokenBytes is the longest attempt token accepted.
	MaxAttemptTokenBytes = 128
	// FingerprintBytes is the length of a fingerprint: a SHA-256 digest.
	FingerprintBytes = 32
	// MinLease is the shortest lease accepted.
	MinLease = time.Second
	// MaxRetention is the longest retention accepted.
	MaxRetention = 365 * 24 * time.Hour
	// MaxTypeURLBytes is the longest outcome type URL accepted.
	MaxTypeURLBytes = 512
)

// Server implements idemgatev1.DedupeServiceServer over a Store.
type Server struct {
	idemgatev1.UnimplementedDedupeServiceServer
	store Store
	opts  options
}

// NewServer returns the Dedupe service over store.
func NewServer(store Store, opts ...Option) *Server {
	o := defaultOptions
	for _, opt := range opts {
		opt(&o)
	}
	return &Server{store: store, opts: o}
}

// Begin implements idemgatev1.DedupeServiceServer.
func (s *Server) Begin(ctx context.Context, req *idemgatev1.BeginRequest) (*idemgatev1.BeginResponse, error) {
	if err := validateRecordID(req.GetScope(), req.GetKey(), req.GetAttemptToken()); err != nil {
		return nil, err
	}
	if len(req.GetFingerprint()) != FingerprintBytes {
		return nil, invalid("fingerprint", fmt.Sprintf("fingerprint must be a %d-byte SHA-256 digest, got %d bytes", FingerprintBytes, len(req.GetFingerprint())))
	}
	lease, err := duration("lease", req.GetLease(), MinLease, MaxRetention)
	if err != nil {
		return nil, err
	}
	retention, err := duration("retention", req.GetRetention(), lease, MaxRetention)
	if err != nil {
		return nil, err
	}
	res, err := s.store.Begin(ctx, BeginParams{
		Scope:        req.GetScope(),
		Key:          req.GetKey(),
		Fingerprint:  req.GetFingerprint(),
		AttemptToken: req.GetAttemptToken(),
		Lease:        lease,
		Retention:    retention,
	})
	if err != nil {
		return nil, s.storeError(ctx, "Begin", err)
	}
	switch res.State {
	case BeginReserved:
		return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_Reserved_{Reserved: &idemgatev1.BeginResponse_Reserved{
			Epoch:          res.Epoch,
			LeaseExpiresAt: timestamppb.New(res.LeaseExpiresAt),
		}}}, nil
	case BeginCompleted:
		return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_Completed_{Completed: &idemgatev1.BeginResponse_Completed{
			Outcome:     &anypb.Any{TypeUrl: res.Outcome.TypeURL, Value: res.Outcome.Value},
			CompletedAt: timestamppb.New(res.CompletedAt),
			ExpiresAt:   timestamppb.New(res.ExpiresAt),
		}}}, nil
	case BeginInFlight:
		return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_InFlight_{InFlight: &idemgatev1.BeginResponse_InFlight{
			LeaseExpiresAt: timestamppb.New(res.LeaseExpiresAt),
		}}}, nil
	case BeginFingerprintMismatch:
		return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_FingerprintMismatch_{FingerprintMismatch: &idemgatev1.BeginResponse_FingerprintMismatch{}}}, nil
	default:
		return nil, status.Errorf(codes.Internal, "dedupesvc: store answered Begin with unknown state %d", res.State)
	}
}

// Finish implements idemgatev1.DedupeServiceServer.
func (s *Server) Finish(ctx context.Context, req *idemgatev1.FinishRequest) (*idemgatev1.FinishResponse, error) {
	if err := validateRecordID(req.GetScope(), req.GetKey(), req.GetAttemptToken()); err != nil {
		return nil, err
	}
	if req.GetEpoch() <= 0 {
		return nil, invalid("epoch", "epoch must be the positive epoch Begin answered")
	}
	outcome := req.GetOutcome()
	switch {
	case outcome == nil:
		return nil, invalid("outcome", "outcome is required")
	case outcome.GetTypeUrl() == "":
		return nil, invalid("outcome.type_url", "outcome.type_url is required")
	case len(outcome.GetTypeUrl()) > MaxTypeURLBytes:
		return nil, invalid("outcome.type_url", fmt.Sprintf("outcome.type_url is longer than %d bytes", MaxTypeURLBytes))
	}
	value := outcome.GetValue()
	if value == nil {
		value = []byte{} // an empty message is a stored outcome, not a missing one
	}
	err := s.store.Finish(ctx, FinishParams{
		Scope:        req.GetScope(),
		Key:          req.GetKey(),
		AttemptToken: req.GetAttemptToken(),
		Epoch:        req.GetEpoch(),
		Outcome:      Outcome{TypeURL: outcome.GetTypeUrl(), Value: value},
	})
	if err != nil {
		return nil, s.storeError(ctx, "Finish", err)
	}
	return &idemgatev1.FinishResponse{}, nil
}

// Release implements idemgatev1.DedupeServiceServer.
func (s *Server) Release(ctx context.Context, req *idemgatev1.ReleaseRequest) (*idemgatev1.ReleaseResponse, error) {
	if err := validateRecordID(req.GetScope(), req.GetKey(), req.GetAttemptToken()); err != nil {
		return nil, err
	}
	if req.GetEpoch() <= 0 {
		return nil, invalid("epoch", "epoch must be the positive epoch Begin answered")
	}
	err := s.store.Release(ctx, ReleaseParams{
		Scope:        req.GetScope(),
		Key:          req.GetKey(),
		AttemptToken: req.GetAttemptToken(),
		Epoch:        req.GetEpoch(),
	})
	if err != nil {
		return nil, s.storeError(ctx, "Release", err)
	}
	return &idemgatev1.ReleaseResponse{}, nil
}

// storeError maps a store error to the status the caller gets. Driver errors
// are logged here and never sent: they can name another tenant's rows.
func (s *Server) storeError(ctx context.Context, rpc string, err error) error {
	switch {
	case errors.Is(err, ErrNotHeld):
		return grpcerr.New(codes.FailedPrecondition, ReasonReservationNotHeld,
			"the reservation is not held by this attempt: it was taken over or already completed; the stored record is unchanged", nil, 0)
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	s.opts.logger.ErrorContext(ctx, "dedupe store failed", slog.String("rpc", rpc), slog.Any("error", err))
	return grpcerr.New(codes.Unavailable, ReasonStoreUnavailable,
		"the dedupe store failed or is unreachable; the call is safe to retry", nil, s.opts.storeRetryAfter)
}

func validateRecordID(scope, key, token string) error {
	switch {
	case scope == "":
		return invalid("scope", "scope is required")
	case len(scope) > MaxScopeBytes:
		return invalid("scope", fmt.Sprintf("scope is longer than %d bytes", MaxScopeBytes))
	}
	if err := keys.Validate(key); err != nil {
		return invalid("key", "key "+err.Error())
	}
	switch {
	case token == "":
		return invalid("attempt_token", "attempt_token is required")
	case len(token) > MaxAttemptTokenBytes:
		return invalid("attempt_token", fmt.Sprintf("attempt_token is longer than %d bytes", MaxAttemptTokenBytes))
	case !keys.Printable(token):
		return invalid("attempt_token", "attempt_token must be printable ASCII")
	}
	return nil
}

func duration(field string, d *durationpb.Duration, lo, hi time.Duration) (time.Duration, error) {
	if d == nil {
		return 0, invalid(field, field+" is required")
	}
	if err := d.CheckValid(); err != nil {
		return 0, invalid(field, field+" is not a valid duration")
	}
	v := d.AsDuration()
	if v < lo || v > hi {
		return 0, invalid(field, fmt.Sprintf("%s must be between %s and %s, got %s", field, lo, hi, v))
	}
	return v, nil
}

func invalid(field, message string) error {
	return grpcerr.New(codes.InvalidArgument, ReasonInvalidRequest, message, map[string]string{"field": field}, 0)
}

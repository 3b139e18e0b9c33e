// Package grpcerr builds the gRPC status errors idemgate returns: a precise
// code, exactly one google.rpc.ErrorInfo with a stable UPPER_SNAKE reason, and
// a google.rpc.RetryInfo where retrying helps.
package grpcerr

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the ErrorInfo domain of every idemgate error.
const Domain = "idemgate.dev"

// New returns a status error with code, message and one ErrorInfo carrying
// reason and metadata (nil for none). A retryAfter above zero adds RetryInfo.
func New(code codes.Code, reason, message string, metadata map[string]string, retryAfter time.Duration) error {
	st := status.New(code, message)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: metadata}}
	if retryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	}
	withDetails, err := st.WithDetails(details...)
	if err != nil {
		// WithDetails fails only for an OK status or an unmarshalable detail,
		// neither of which can reach here; keep the code and message anyway.
		return st.Err()
	}
	return withDetails.Err()
}

// Reason returns the ErrorInfo reason of err, or "" when err carries none.
func Reason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// Metadata returns the ErrorInfo metadata of err, nil when err carries no
// ErrorInfo.
func Metadata(err error) map[string]string {
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetMetadata()
		}
	}
	return nil
}

// RetryDelay returns the RetryInfo delay of err and whether it has one.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.RetryInfo); ok {
			return info.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

package chaos

import (
	"net/http"

	"google.golang.org/grpc/codes"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
)

// Transports a scenario's callers reach the tool servers through.
const (
	// TransportGRPC is the idemgate interceptor, called with grpc-go: the
	// default.
	TransportGRPC = "grpc"
	// TransportHTTP is httpgate, called with net/http.
	TransportHTTP = "http"
	// TransportConnect is connectgate, called with connect-go's client
	// (the Connect protocol).
	TransportConnect = "connect"
)

// The chaos tool's HTTP routes (chaos-tool -http-listen): each stands for
// one ChaosService method and has its policy.
const (
	HTTPChargePath          = "/charge"
	HTTPChargeReexecutePath = "/charge-reexecute"
	// HTTPProtoContentType is the media type of the binary protobuf bodies.
	HTTPProtoContentType = "application/x-protobuf"
)

// HTTPPath is the route that stands for a ChaosService method, "" for
// another.
func HTTPPath(method string) string {
	switch method {
	case testingv1.ChaosService_Charge_FullMethodName:
		return HTTPChargePath
	case testingv1.ChaosService_ChargeReexecute_FullMethodName:
		return HTTPChargeReexecutePath
	}
	return ""
}

// reasonCodes are the gRPC codes the gates give their refusals' reasons
// (internal/gatecore): an HTTP refusal carrying one of them is recorded
// with its code, so the history reads the same whatever the transport.
var reasonCodes = map[string]codes.Code{
	"IDEMPOTENCY_KEY_MISSING":           codes.InvalidArgument,
	"IDEMPOTENCY_KEY_INVALID":           codes.InvalidArgument,
	"IDEMPOTENCY_KEY_CONFLICT":          codes.InvalidArgument,
	"IDEMPOTENCY_KEY_REUSED":            codes.FailedPrecondition,
	"IDEMPOTENCY_IN_FLIGHT":             codes.Aborted,
	"IDEMPOTENCY_OUTCOME_UNKNOWN":       codes.FailedPrecondition,
	"IDEMPOTENCY_RESULT_TOO_LARGE":      codes.FailedPrecondition,
	"IDEMPOTENCY_STORE_UNAVAILABLE":     codes.Unavailable,
	"IDEMPOTENCY_QUOTA_EXCEEDED":        codes.ResourceExhausted,
	"IDEMPOTENCY_STORE_REJECTED":        codes.Internal,
	"IDEMPOTENCY_OUTCOME_TYPE_MISMATCH": codes.Internal,
	"IDEMPOTENCY_REQUEST_TOO_LARGE":     codes.InvalidArgument,
	"IDEMPOTENCY_UNAUTHENTICATED":       codes.Unauthenticated,
}

// HTTPCode is the gRPC code an HTTP answer is recorded with: OK for a 2xx;
// for a refusal, the code of its problem's reason; else by status, as the
// gRPC handler's own errors would read (504, the tool's ambiguous failure
// and a handler cut short, is DEADLINE_EXCEEDED).
func HTTPCode(status int, reason string) codes.Code {
	if status >= 200 && status < 300 {
		return codes.OK
	}
	if c, ok := reasonCodes[reason]; ok {
		return c
	}
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return codes.Unimplemented
	case http.StatusConflict:
		return codes.Aborted
	case http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case 499:
		return codes.Canceled
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return codes.Unavailable
	case http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	case http.StatusNotImplemented:
		return codes.Unimplemented
	}
	if status >= 500 {
		return codes.Internal
	}
	return codes.Unknown
}

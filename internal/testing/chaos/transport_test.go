package chaos

import (
	"testing"

	"google.golang.org/grpc/codes"
)

// TestHTTPCode holds the HTTP workload's reading of an answer to the codes
// the gRPC gate gives the same answers, which the application loop and the
// checker go by.
func TestHTTPCode(t *testing.T) {
	for _, tc := range []struct {
		status int
		reason string
		want   codes.Code
	}{
		{200, "", codes.OK},
		{201, "", codes.OK},
		{409, "IDEMPOTENCY_IN_FLIGHT", codes.Aborted},
		{503, "IDEMPOTENCY_STORE_UNAVAILABLE", codes.Unavailable},
		{409, "IDEMPOTENCY_OUTCOME_UNKNOWN", codes.FailedPrecondition},
		{429, "IDEMPOTENCY_QUOTA_EXCEEDED", codes.ResourceExhausted},
		{422, "IDEMPOTENCY_KEY_REUSED", codes.FailedPrecondition},
		{400, "IDEMPOTENCY_KEY_MISSING", codes.InvalidArgument},
		{504, "", codes.DeadlineExceeded}, // the tool's ambiguous failure
		{502, "", codes.Unavailable},
		{503, "", codes.Unavailable},
		{499, "", codes.Canceled},
		{500, "", codes.Internal},
	} {
		if got := HTTPCode(tc.status, tc.reason); got != tc.want {
			t.Errorf("HTTPCode(%d, %q) = %s, want %s", tc.status, tc.reason, got, tc.want)
		}
	}
}

package grpcerr

import (
	"testing"

	"google.golang.org/grpc/codes"
)

func TestCodeNamesAreGoogleRPCs(t *testing.T) {
	for c, want := range map[codes.Code]string{
		codes.OK: "OK", codes.Canceled: "CANCELLED", codes.InvalidArgument: "INVALID_ARGUMENT",
		codes.DeadlineExceeded: "DEADLINE_EXCEEDED", codes.FailedPrecondition: "FAILED_PRECONDITION",
		codes.Unauthenticated: "UNAUTHENTICATED", codes.Code(42): "Code(42)",
	} {
		if got := CodeName(c); got != want {
			t.Errorf("CodeName(%v) = %q, want %q", c, got, want)
		}
	}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if got, ok := CodeByName(CodeName(c)); !ok || got != c {
			t.Errorf("CodeByName(CodeName(%v)) = %v, %v", c, got, ok)
		}
	}
	if got, ok := CodeByName("CANCELED"); !ok || got != codes.Canceled {
		t.Errorf("CodeByName(CANCELED) = %v, %v; want the old spelling still read", got, ok)
	}
	for _, bad := range []string{"", "canceled", "Canceled", "INVALID ARGUMENT", "Code(42)"} {
		if c, ok := CodeByName(bad); ok {
			t.Errorf("CodeByName(%q) = %v, want refused", bad, c)
		}
	}
}

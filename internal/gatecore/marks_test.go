package gatecore_test

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/gatecore"
)

// The marks are made by package idemgate and read here: each must still
// ask for its verdict when wrapped, and keep the handler's status.
func TestMarkedReadsTheVocabularysMarks(t *testing.T) {
	base := status.Error(codes.FailedPrecondition, "card declined")
	for _, tc := range []struct {
		name string
		mark func(error) error
		want gatecore.Verdict
	}{
		{"FinalError", idemgate.FinalError, gatecore.VerdictOutcome},
		{"RetryableError", idemgate.RetryableError, gatecore.VerdictNotRun},
		{"OutcomeUnknownError", idemgate.OutcomeUnknownError, gatecore.VerdictUnknown},
	} {
		marked := tc.mark(base)
		if got := status.Code(marked); got != codes.FailedPrecondition {
			t.Errorf("%s: status code %v, want the handler's %v", tc.name, got, codes.FailedPrecondition)
		}
		v, inner, ok := gatecore.Marked(fmt.Errorf("wrapped: %w", marked))
		if !ok || v != tc.want || inner != base {
			t.Errorf("%s: Marked = %v, %v, %v; want %v, the handler's error, true", tc.name, v, inner, ok, tc.want)
		}
		if tc.mark(nil) != nil {
			t.Errorf("%s(nil) is not nil", tc.name)
		}
	}
	if v, inner, ok := gatecore.Marked(base); ok || inner != base {
		t.Errorf("an unmarked error: Marked = %v, %v, %v; want no mark", v, inner, ok)
	}
}

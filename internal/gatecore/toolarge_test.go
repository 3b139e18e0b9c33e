package gatecore_test

import (
	"encoding/hex"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
)

// TestTooLargeSaysWhyTheOutcomeWasNotStored: a duplicate of an outcome
// replaced by the ResultTooLarge marker gets IDEMPOTENCY_RESULT_TOO_LARGE
// whatever the cause, with a message and an ErrorInfo "cause" that say
// which it was: the size limit, or the caller's stored-bytes quota. A
// marker an older version stored (no cause) still reads as the size limit.
func TestTooLargeSaysWhyTheOutcomeWasNotStored(t *testing.T) {
	t.Parallel()
	const url = "type.googleapis.com/idemgate.v1.ResultTooLarge"
	// ResultTooLarge{size_bytes: 2000, type_url: ...MutateResponse} as a
	// gate before the cause field wrote it.
	older, err := hex.DecodeString("08d00f1236747970652e676f6f676c65617069732e636f6d2f6964656d676174652e74657374696e672e76312e4d7574617465526573706f6e7365")
	if err != nil {
		t.Fatal(err)
	}
	marker := func(cause idemgatev1.ResultTooLargeCause) *anypb.Any {
		a, err := gatecore.MarshalAny(&idemgatev1.ResultTooLarge{SizeBytes: 2000, TypeUrl: "type.googleapis.com/x.R", Cause: cause})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for _, tc := range []struct {
		name      string
		outcome   *anypb.Any
		wantCause string
		wantIn    string
		wantNotIn string
	}{
		{"written by an older version", &anypb.Any{TypeUrl: url, Value: older}, "size_limit", "over the size limit", "quota"},
		{"size limit", marker(idemgatev1.ResultTooLargeCause_RESULT_TOO_LARGE_CAUSE_SIZE_LIMIT), "size_limit", "over the size limit", "quota"},
		{"stored-bytes quota", marker(idemgatev1.ResultTooLargeCause_RESULT_TOO_LARGE_CAUSE_STORED_BYTES_QUOTA), "stored_bytes_quota", "stored-outcome quota", "over the size limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := gatecore.TooLarge(tc.outcome)
			st, _ := status.FromError(err)
			if st.Code() != codes.FailedPrecondition {
				t.Fatalf("TooLarge = %v; want FAILED_PRECONDITION", err)
			}
			var info *errdetails.ErrorInfo
			for _, d := range st.Details() {
				if i, ok := d.(*errdetails.ErrorInfo); ok {
					info = i
				}
			}
			if info.GetReason() != idemgate.ReasonResultTooLarge {
				t.Fatalf("reason %q; want %s, whatever the cause", info.GetReason(), idemgate.ReasonResultTooLarge)
			}
			if md := info.GetMetadata(); md["cause"] != tc.wantCause || md["size_bytes"] != "2000" {
				t.Errorf("ErrorInfo metadata %v; want cause %s and size_bytes 2000", md, tc.wantCause)
			}
			if msg := st.Message(); !strings.Contains(msg, tc.wantIn) || strings.Contains(msg, tc.wantNotIn) {
				t.Errorf("message %q; want it to say %q, not %q", msg, tc.wantIn, tc.wantNotIn)
			}
		})
	}
	if err := gatecore.TooLarge(&anypb.Any{TypeUrl: "type.googleapis.com/x.R"}); err != nil {
		t.Errorf("TooLarge of an outcome that is no marker = %v; want nil", err)
	}
}

package dedupeapp_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// Keys with leading or trailing spaces, or only spaces, are refused: HTTP/2
// forbids such header values and proxies may trim them, so " order-1" and
// "order-1" would otherwise be two executions of one action.
func TestKeysWithEdgeSpacesAreRefused(t *testing.T) {
	t.Parallel()
	dedupe := idemgatev1.NewDedupeServiceClient(dial(t, stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir()})))
	for _, key := range []string{" order-1", "order-1 ", " ", "   "} {
		_, err := dedupe.Begin(callCtx(t), beginRequest(key))
		wantRefusal(t, err, codes.InvalidArgument, dedupesvc.ReasonInvalidRequest, "key")
	}
	if _, err := dedupe.Begin(callCtx(t), beginRequest("order 1")); err != nil {
		t.Fatalf("a key with an inner space: %v, want it accepted", err)
	}
}

package dedupeapp_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// -resolve-admin-only reserves Resolve to admins; without it every caller
// resolves its own records.
func TestResolveAdminOnly(t *testing.T) {
	t.Parallel()
	resolve := func(addr, secret string) error {
		_, err := idemgatev1.NewDedupeServiceClient(dial(t, addr, withToken(secret))).Resolve(callCtx(t), &idemgatev1.ResolveRequest{
			Scope: "/x.S/M", Key: "k", Resolution: &idemgatev1.ResolveRequest_Release_{Release: &idemgatev1.ResolveRequest_Release{}}})
		return err
	}
	open := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokenFile(t)})
	wantRefusal(t, resolve(open, clientSecret), codes.NotFound, dedupesvc.ReasonRecordNotFound, "")

	reserved := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokenFile(t), ResolveAdminOnly: true})
	wantRefusal(t, resolve(reserved, clientSecret), codes.PermissionDenied, auth.ReasonPermissionDenied, "")
	wantRefusal(t, resolve(reserved, adminSecret), codes.NotFound, dedupesvc.ReasonRecordNotFound, "")
	// Other calls of a client are unaffected.
	if _, err := idemgatev1.NewDedupeServiceClient(dial(t, reserved, withToken(clientSecret))).Begin(callCtx(t), beginRequest("k")); err != nil {
		t.Fatalf("Begin with -resolve-admin-only: %v", err)
	}
}

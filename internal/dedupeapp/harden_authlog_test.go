package dedupeapp_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	"github.com/idemgate/idemgate/dedupesvc/auth"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// Every refused authentication is counted by reason and logged, the log
// rate-limited and never holding the presented secret.
func TestAuthRefusalsAreCountedAndLogged(t *testing.T) {
	t.Parallel()
	metricsAddr := stacktest.FreeAddr(t)
	addr, logs := startLogged(t, dedupeapp.Config{TokenFile: tokenFile(t), MetricsListen: metricsAddr, AuthRefusalLogRate: 0.001})
	const hostile = "hostile-secret-must-not-be-logged"
	bad := idemgatev1.NewDedupeServiceClient(dial(t, addr, withToken(hostile)))
	for range 100 {
		_, err := bad.Begin(callCtx(t), beginRequest("k"))
		wantRefusal(t, err, codes.Unauthenticated, auth.ReasonUnauthenticated, "")
	}
	_, err := idemgatev1.NewDedupeServiceClient(dial(t, addr)).Begin(callCtx(t), beginRequest("k"))
	wantRefusal(t, err, codes.Unauthenticated, auth.ReasonUnauthenticated, "")
	client := idemgatev1.NewAdminServiceClient(dial(t, addr, withToken(clientSecret)))
	for range 3 {
		_, err := client.CountRecords(callCtx(t), &idemgatev1.CountRecordsRequest{})
		wantRefusal(t, err, codes.PermissionDenied, auth.ReasonPermissionDenied, "")
	}

	want := `
# HELP idemgate_dedupe_auth_refusals_total Calls refused by authentication, by reason: missing_credentials, invalid_token, not_admin, invalid_agent.
# TYPE idemgate_dedupe_auth_refusals_total counter
idemgate_dedupe_auth_refusals_total{reason="invalid_agent"} 0
idemgate_dedupe_auth_refusals_total{reason="invalid_token"} 100
idemgate_dedupe_auth_refusals_total{reason="missing_credentials"} 1
idemgate_dedupe_auth_refusals_total{reason="not_admin"} 3
`
	if err := testutil.ScrapeAndCompare("http://"+metricsAddr+"/metrics", strings.NewReader(want), "idemgate_dedupe_auth_refusals_total"); err != nil {
		t.Fatal(err)
	}

	text := logs.String()
	if strings.Contains(text, hostile) {
		t.Fatalf("the log holds the presented secret:\n%s", text)
	}
	lines := strings.Count(text, "authentication refused")
	// A burst of 10, then (at 0.001 a second) nothing more during the test.
	if lines == 0 || lines > 11 {
		t.Fatalf("%d refusal log lines, want 1 to 11 (rate-limited):\n%s", lines, text)
	}
	if !strings.Contains(text, "reason=invalid_token") || !strings.Contains(text, "peer=127.0.0.1") {
		t.Fatalf("the refusal log lines lack the reason or the peer:\n%s", text)
	}
}

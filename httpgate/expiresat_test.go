package httpgate_test

import (
	"testing"
	"time"

	"github.com/idemgate/idemgate/httpgate"
	"github.com/idemgate/idemgate/internal/gatecore"
)

// TestExpiresAtIsSpelledAlikeOnFirstAnswerAndReplay: the first answer's
// Idempotency-Expires-At (this process's estimate) and the replay's (the
// record's, as PostgreSQL keeps it to the microsecond) are both RFC 3339
// UTC to the millisecond (gatecore.HeaderTime), the estimate never the
// later; Idempotency-Original-Time too. Before, the first answer carried
// nanoseconds and the replay the store's precision.
func TestExpiresAtIsSpelledAlikeOnFirstAnswerAndReplay(t *testing.T) {
	f := setup(t, dedupe(t))
	first := post(t, f.url+"/charges", `"expires"`, chargeBody)
	replay := post(t, f.url+"/charges", `"expires"`, chargeBody)
	if replay.header.Get(httpgate.ReplayedHeader) != "true" {
		t.Fatalf("second answer not replayed: %d %v", replay.status, replay.header)
	}
	times := map[string]time.Time{}
	for name, v := range map[string]string{
		"first " + httpgate.ExpiresAtHeader:     first.header.Get(httpgate.ExpiresAtHeader),
		"replay " + httpgate.ExpiresAtHeader:    replay.header.Get(httpgate.ExpiresAtHeader),
		"replay " + httpgate.OriginalTimeHeader: replay.header.Get(httpgate.OriginalTimeHeader),
	} {
		tm, err := time.Parse(gatecore.HeaderTimeLayout, v)
		if err != nil || tm.Format(gatecore.HeaderTimeLayout) != v {
			t.Fatalf("%s = %q, want RFC 3339 UTC with three fractional digits (%v)", name, v, err)
		}
		times[name] = tm
	}
	if est, rec := times["first "+httpgate.ExpiresAtHeader], times["replay "+httpgate.ExpiresAtHeader]; est.After(rec) {
		t.Errorf("the first answer promised %v, later than the record's expiry %v", est, rec)
	}
}

package replayfields_test

import (
	"testing"

	"github.com/idemgate/idemgate/internal/replayfields"
)

func TestRule(t *testing.T) {
	r := replayfields.New("X-Caller")
	for _, name := range []string{"Set-Cookie", "set-cookie2", "Authorization-Info", "Proxy-Authentication-Info",
		"Access-Control-Allow-Origin", "access-control-allow-credentials", "Access-Control-Max-Age", "x-caller", "X-CALLER"} {
		if !r.PerCaller(name) || r.Stored(name) {
			t.Errorf("%s: per-caller %v, stored %v; want per-caller, not stored", name, r.PerCaller(name), r.Stored(name))
		}
	}
	for _, name := range []string{"Connection", "date", "Content-Length", "Transfer-Encoding", "Trailer", "TE", "Upgrade", "Keep-Alive", "Proxy-Connection"} {
		if r.PerCaller(name) || r.Stored(name) {
			t.Errorf("%s: per-caller %v, stored %v; want a connection field, not stored", name, r.PerCaller(name), r.Stored(name))
		}
	}
	for _, name := range []string{"Content-Type", "Cache-Control", "Vary", "Location", "X-Charge-Id", "WWW-Authenticate"} {
		if !r.Stored(name) {
			t.Errorf("%s is not stored", name)
		}
	}
	if (replayfields.Rule{}).PerCaller("X-Caller") {
		t.Error("the zero Rule holds X-Caller")
	}
}

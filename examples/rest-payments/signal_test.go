package main

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemgate/idemgate/httpgate"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// SIGINT (Ctrl-C) stops the server gracefully, and its log says so: that
// it is stopping, then that it stopped.
func TestInterruptIsLogged(t *testing.T) {
	t.Parallel()
	addr := stacktest.FreeAddr(t)
	p := proctest.Start(t, proctest.Build(t, "."), []string{"-listen", addr, "-data-dir", t.TempDir(), "-caller-token-file", demoTokens(t)}, nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	p.WantCleanInterrupt(t, "msg=\"stopping", "msg=stopped")
}

// SIGTERM while a charge runs and the Dedupe service has gone away: the
// server stops within -shutdown-timeout (no timing is asserted), logs the
// outcome it could not store as lost, and exits 0, instead of waiting 30s
// and exiting 1. The duplicate's 409 shows the charge is in flight first.
func TestTermWithTheDedupeServiceGoneIsBoundedAndClean(t *testing.T) {
	t.Parallel()
	dedupeAddr, stopDedupe := stacktest.StartApp(t, dedupeapp.Config{DataDir: t.TempDir()})
	addr := stacktest.FreeAddr(t)
	p := proctest.Start(t, proctest.Build(t, "."), []string{"-listen", addr, "-dedupe", dedupeAddr, "-caller-token-file", demoTokens(t),
		"-charge-delay", "10m", "-shutdown-timeout", "2s"}, nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	post := func() (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/charges", strings.NewReader(`{"customer":"cus_1","amount":5,"currency":"usd"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(httpgate.KeyHeader, `"ord-1"`)
		req.Header.Set("Authorization", "Bearer alice-demo-token")
		return http.DefaultClient.Do(req) // the holder's request is cut when the server exits
	}
	// Whichever request reserves the key first holds it for -charge-delay and
	// answers only when the server exits, so each request runs on its own and
	// the first answer to come back must be a duplicate's 409: which request
	// is the holder is the scheduler's choice, not the test's.
	answers := make(chan int, 32)
	send := func() {
		go func() {
			resp, err := post()
			if err != nil {
				answers <- -1
				return
			}
			resp.Body.Close()
			answers <- resp.StatusCode
		}()
	}
	send()
	for try := 0; ; try++ {
		if try == 20 {
			t.Fatalf("no duplicate was answered 409 after %d tries\n%s", try, p.Log())
		}
		send()
		var code int
		select {
		case code = <-answers:
		case <-time.After(2 * time.Minute):
			t.Fatalf("no request answered in 2m\n%s", p.Log())
		}
		if code == http.StatusConflict {
			break // another request holds the key
		}
		if code < 0 {
			t.Fatalf("a request failed before the server was stopped\n%s", p.Log())
		}
		t.Logf("request %d: %d", try, code)
	}
	if err := stopDedupe(); err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(2 * time.Minute); err != nil {
		t.Fatalf("rest-payments after SIGTERM with its Dedupe service gone: %v, want exit 0\n%s", err, p.Log())
	}
	if log := p.Log(); !strings.Contains(log, "outcomes lost at shutdown") || !strings.Contains(log, "msg=stopped") {
		t.Errorf("the log does not say the outcome was lost and the server stopped:\n%s", log)
	}
}

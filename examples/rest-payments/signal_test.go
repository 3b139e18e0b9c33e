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
	p := proctest.Start(t, proctest.Build(t, "."), []string{"-listen", addr, "-data-dir", t.TempDir(), "-caller-token-file", "tokens.txt"}, nil)
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
	p := proctest.Start(t, proctest.Build(t, "."), []string{"-listen", addr, "-dedupe", dedupeAddr, "-caller-token-file", "tokens.txt",
		"-charge-delay", "10m", "-shutdown-timeout", "2s"}, nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	post := func() (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/charges", strings.NewReader(`{"customer":"cus_1","amount":5,"currency":"usd"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(httpgate.KeyHeader, `"ord-1"`)
		req.Header.Set("Authorization", "Bearer alice-demo-token")
		return (&http.Client{Timeout: time.Minute}).Do(req)
	}
	go func() {
		if resp, err := post(); err == nil { // cut when the server exits
			resp.Body.Close()
		}
	}()
	for try := 0; ; try++ {
		resp, err := post()
		if err != nil || try == 20 {
			t.Fatalf("duplicate %d: %v\n%s", try, err, p.Log())
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusConflict {
			break // the original holds the key
		}
		t.Logf("duplicate %d: %d", try, resp.StatusCode)
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

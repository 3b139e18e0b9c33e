package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testing/httpattack"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// Slowloris from one address, with more connections than the server has
// descriptors, each trickling a body: another client's charge is still
// served (before, every descriptor was held and the charge timed out).
func TestSlowlorisDoesNotStopACharge(t *testing.T) {
	t.Parallel()
	addr := stacktest.FreeAddr(t)
	prog, args := httpattack.WithFileLimit(160, proctest.Build(t, "."), "-listen", addr, "-data-dir", t.TempDir(), "-caller-token-file", demoTokens(t))
	p := proctest.Start(t, prog, args, nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	head := httpattack.Request(http.MethodPost, "/charges", addr, []string{"Authorization: Bearer alice-demo-token", "Content-Type: application/json",
		`Idempotency-Key: "slow"`, "Content-Length: 1000000"}, nil)
	a := httpattack.Slowloris(context.Background(), "127.0.0.1", addr, 300, head, 10*time.Second)
	defer a.Close()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/charges", strings.NewReader(`{"customer":"cus_1","amount":1999,"currency":"usd"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"legit-1"`)
	req.Header.Set("Authorization", "Bearer bob-demo-token")
	resp, err := httpattack.Client("127.0.0.2", 2*time.Minute).Do(req)
	if err != nil {
		t.Fatalf("a charge beside %d slowloris connections: %v", a.Opened.Load(), err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("a charge beside the slowloris: %s, want 201", resp.Status)
	}
}

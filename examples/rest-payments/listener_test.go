package main

import (
	"context"
	"fmt"
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
	if err := bobCharges(addr, `"legit-1"`); err != nil {
		t.Fatalf("a charge beside %d slowloris connections: %v", a.Opened.Load(), err)
	}
}

// bobCharges posts bob's charge with key from 127.0.0.2, waiting up to 2
// minutes for a 201.
func bobCharges(addr, key string) error {
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/charges", strings.NewReader(`{"customer":"cus_1","amount":1999,"currency":"usd"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", "Bearer bob-demo-token")
	resp, err := httpattack.Client("127.0.0.2", 2*time.Minute).Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("%s, want 201", resp.Status)
	}
	return nil
}

// Slowloris from many addresses, as many trickling connections as the
// server holds (issue 40 item 4: 512 from 18 addresses held every slot
// until the read timeout reaped them, and a charge waited for it): once
// the listener is full, the connection reading its body slowest (below
// 240 bytes a second after 5 s) gives its slot to the new one, and the
// charge is served. The read timeout is 10 minutes here, so only that can
// make room within the charge's 2 minutes.
func TestSlowlorisFromManyAddressesDoesNotStopACharge(t *testing.T) {
	t.Parallel()
	addr := stacktest.FreeAddr(t)
	p := proctest.Start(t, proctest.Build(t, "."), []string{"-listen", addr, "-data-dir", t.TempDir(), "-caller-token-file", demoTokens(t),
		"-max-connections", "32", "-read-timeout", "10m"}, nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	head := httpattack.Request(http.MethodPost, "/charges", addr, []string{"Authorization: Bearer alice-demo-token", "Content-Type: application/json",
		`Idempotency-Key: "slow"`, "Content-Length: 1000000"}, nil)
	for i := range 4 {
		a := httpattack.Slowloris(context.Background(), fmt.Sprintf("127.0.0.%d", 10+i), addr, 8, head, time.Second)
		defer a.Close()
	}
	time.Sleep(2 * time.Second) // the server admits the 32 and reads their heads
	if err := bobCharges(addr, `"legit-many"`); err != nil {
		t.Fatalf("a charge beside 32 trickling connections from 4 addresses, the listener full: %v", err)
	}
}

package main_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/mcpwire"
	"github.com/idemgate/idemgate/internal/testing/httpattack"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

var mcpHeaders = []string{"Content-Type: application/json", "Accept: application/json, text/event-stream", "MCP-Protocol-Version: 2025-06-18"}

// getBalance is a raw tools/call of GetBalance for customer id.
func getBalance(addr, id string) []byte {
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"examples.payments.v1.PaymentsService.GetBalance","arguments":{"customerId":%q}}}`, id)
	return httpattack.Request(http.MethodPost, "/mcp", addr, mcpHeaders, []byte(body))
}

// startListening starts the binary on a free loopback address with extra
// flags, returning its address.
func startListening(t *testing.T, extra ...string) string {
	t.Helper()
	addr := stacktest.FreeAddr(t)
	p := proctest.Start(t, proctest.Build(t, "."), append([]string{"-target", toolTarget(t), "-plaintext", "-listen", addr}, extra...), nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	return addr
}

// One client's idle keep-alive connections fill -max-connections; another
// client's call is served all the same: the first client's oldest idle
// connections are closed for it (before, it waited for -idle-timeout).
func TestIdleKeepAlivesDoNotLockOutAnotherCaller(t *testing.T) {
	t.Parallel()
	addr := startListening(t, "-max-connections", "4")
	ctx := context.Background()
	a, answered := httpattack.IdleKeepAlives(ctx, "127.0.0.1", addr, 8, getBalance(addr, "a"))
	defer a.Close()
	if answered != 8 {
		t.Fatalf("client A: %d of 8 answered, want 8: its own idle connections give way", answered)
	}
	b, answered := httpattack.IdleKeepAlives(ctx, "127.0.0.2", addr, 2, getBalance(addr, "b"))
	defer b.Close()
	if answered != 2 {
		t.Fatalf("client B: %d of 2 answered beside A's idle connections, want 2", answered)
	}
}

// A caller that never reads a large answer is disconnected after
// -write-timeout, short of the answer, and its memory with it.
func TestNeverReadingCallerIsDropped(t *testing.T) {
	t.Parallel()
	addr := startListening(t, "-write-timeout", "1s")
	const size = 3 << 20 // echoed twice in the answer
	p := httpattack.NeverRead(context.Background(), "127.0.0.1", addr, 2, getBalance(addr, strings.Repeat("c", size)))
	defer p.Close()
	if err := p.WaitAnswering(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	// Well past the write timeout from the answer's start, even on a
	// starved machine; reading nothing meanwhile.
	time.Sleep(10 * time.Second)
	got, closed := p.Drain(30 * time.Second)
	for i := range got {
		if !closed[i] || got[i] >= 2*size {
			t.Errorf("caller %d: closed %v after %d bytes of a %d-byte answer, want dropped short of it", i, closed[i], got[i], 2*size)
		}
	}
}

// One address cannot take the body budget from the others (issue 40 item
// 1): 64 connections from 127.0.0.2 (its per-address cap), each declaring
// a 4 MiB body and trickling a byte a second, held the whole default
// -max-buffered-bytes by their Content-Length alone, and every neighbour
// got 503. Bodies now hold only the bytes that arrived, and each address
// at most -max-buffered-bytes-per-ip.
func TestOneAddressCannotTakeTheBodyBudget(t *testing.T) {
	t.Parallel()
	addr := startListening(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	head := httpattack.Request(http.MethodPost, "/mcp", addr, append(mcpHeaders, fmt.Sprintf("Content-Length: %d", mcpwire.DefaultMaxBodyBytes)), nil)
	attack := httpattack.Slowloris(ctx, "127.0.0.2", addr, 64, head, time.Second)
	defer attack.Close()
	if attack.Failed.Load() > 0 {
		t.Fatalf("%d of the attacker's 64 connections failed to open", attack.Failed.Load())
	}
	// Room for a loaded machine to read the 64 heads; the old budget was
	// gone within milliseconds of them.
	time.Sleep(2 * time.Second)
	url := "http://" + addr + "/mcp"
	for i := range 3 {
		if res, err := charge(ctx, url, "", fmt.Sprintf("neighbour-%d", i)); err != nil || res.IsError {
			t.Errorf("the neighbour's call %d beside 64 trickled 4 MiB bodies from one address: %v %+v", i, err, res)
		}
	}
	if open := attack.Open(); open != 64 {
		t.Logf("%d of the attacker's connections still open", open)
	}
}

package mcpwire_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/mcpwire"
)

// A chunked body cut before its last chunk is refused, not served: the
// JSON in it may be whole, but the client never finished sending it.
func TestATruncatedChunkedBodyIsNotServed(t *testing.T) {
	t.Parallel()
	served := make(chan string, 1)
	h := mcpwire.HTTPMiddleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		served <- string(b)
	}), mcpwire.HTTPLimits{})
	srv := httptest.NewServer(h)
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	body := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n%x\r\n%s\r\n", len(body), body)
	// No terminating zero-length chunk: the client stops sending.
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("a truncated chunked body answered %d, want a refusal", resp.StatusCode)
		}
	}
	select {
	case b := <-served:
		t.Errorf("the handler was served the truncated body %q", b)
	default:
	}
}

// A buffer budget below twice the body limit would refuse the largest
// chunked body for ever (it is held twice while joined): refused at start.
func TestABufferBudgetBelowTwoBodiesIsRefused(t *testing.T) {
	t.Parallel()
	if err := (mcpwire.HTTPLimits{MaxBodyBytes: 1 << 20, MaxBufferedBytes: 1 << 20}).Check("-"); err == nil {
		t.Fatal("a budget of one body accepted")
	}
	if err := (mcpwire.HTTPLimits{MaxBodyBytes: 1 << 20, MaxBufferedBytes: 2 << 20}).Check("-"); err != nil {
		t.Fatalf("a budget of two bodies: %v", err)
	}
	if err := (mcpwire.HTTPLimits{}).Check("-"); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
}

package mcpwire_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/mcpwire"
)

// countingBody counts the bytes read of an endless body.
type countingBody struct{ read int }

func (c *countingBody) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = ' '
	}
	c.read += len(p)
	return len(p), nil
}

func (c *countingBody) Close() error { return nil }

// A body over the limit gets 413: one whose Content-Length says so before
// any of it is read, one without (chunked) once the reading passes the
// limit, never read whole; the handler never runs. The default is the SDK's
// 4 MiB (HTTPMiddleware read 16 MiB before).
func TestHTTPMiddlewareRefusesALongBodyUnread(t *testing.T) {
	if mcpwire.DefaultMaxBodyBytes != 4<<20 {
		t.Errorf("DefaultMaxBodyBytes = %d, want 4 MiB", mcpwire.DefaultMaxBodyBytes)
	}
	served := 0
	h := mcpwire.HTTPMiddleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ }), mcpwire.HTTPLimits{MaxBodyBytes: 1 << 20})
	for _, length := range []int64{1 << 30, -1} {
		body := &countingBody{}
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		r.Body, r.ContentLength = body, length
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusRequestEntityTooLarge || !strings.Contains(w.Body.String(), "exceeds 1048576 bytes") {
			t.Errorf("Content-Length %d: %d %q, want 413", length, w.Code, w.Body.String())
		}
		want := 0
		if length < 0 {
			want = 2 << 20 // io.ReadAll's last buffer past the limit at most
		}
		if body.read > want {
			t.Errorf("Content-Length %d: %d bytes read, want at most %d", length, body.read, want)
		}
	}
	r := httptest.NewRequest(http.MethodPost, "/mcp", io.NopCloser(strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)))
	h.ServeHTTP(httptest.NewRecorder(), r)
	if served != 1 {
		t.Errorf("served %d, want the one body under the limit", served)
	}
}

// The bodies held at once stay within MaxBufferedBytes: while one body
// is being served, another that would pass the budget gets 503 with
// Retry-After, with a known length or without; once the first is done, it
// is served. A body within the budget alongside is served. (One without a
// length is held twice while its pieces are joined.)
func TestHTTPMiddlewareBoundsTheBodiesHeldAtOnce(t *testing.T) {
	hold, holding := make(chan struct{}), make(chan struct{})
	h := mcpwire.HTTPMiddleware(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			holding <- struct{}{}
			<-hold
		}
	}), mcpwire.HTTPLimits{MaxBodyBytes: 2 << 20, MaxBufferedBytes: 3 << 19})
	post := func(size int, length bool, hold bool) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		r.Body = io.NopCloser(strings.NewReader(strings.Repeat(" ", size)))
		r.ContentLength = -1
		if length {
			r.ContentLength = int64(size)
		}
		if hold {
			r.Header.Set("X-Hold", "1")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- post(1<<20, true, true) }()
	<-holding
	for _, length := range []bool{true, false} {
		if w := post(600<<10, length, false); w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
			t.Errorf("a second body (length known %v) while the first is held: %d %v, want 503 with Retry-After", length, w.Code, w.Header())
		}
	}
	if w := post(100<<10, true, false); w.Code != http.StatusOK {
		t.Errorf("a body within the budget: %d %s", w.Code, w.Body.String())
	}
	close(hold)
	if w := <-done; w.Code != http.StatusOK {
		t.Errorf("the held body: %d", w.Code)
	}
	for _, length := range []bool{true, false} {
		if w := post(600<<10, length, false); w.Code != http.StatusOK {
			t.Errorf("after the first is done (length known %v): %d %s", length, w.Code, w.Body.String())
		}
	}
}

// trickle is a request body that has sent one byte of what its
// Content-Length declares and blocks until the test ends.
func trickle(t *testing.T) io.ReadCloser {
	r, w := io.Pipe()
	go func() { _, _ = w.Write([]byte("{")) }()
	t.Cleanup(func() { _ = w.CloseWithError(io.ErrUnexpectedEOF) })
	return r
}

// Bodies hold the bytes that arrived, not what their Content-Length
// declares, and one client address holds at most MaxBufferedBytesPerIP
// (issue 40 item 1: 64 bodies declaring 4 MiB from one address, one byte
// each, held the whole budget and every other client got 503).
func TestHTTPMiddlewareTakesBodiesAsTheyArrivePerAddress(t *testing.T) {
	h := mcpwire.HTTPMiddleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		mcpwire.HTTPLimits{MaxBodyBytes: 2 << 20, MaxBufferedBytes: 8 << 20, MaxBufferedBytesPerIP: 4 << 20})
	post := func(from string, body io.ReadCloser, length int64) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		r.RemoteAddr = from + ":40000"
		r.Body, r.ContentLength = body, length
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	// Eight bodies from one address declaring 2 MiB each, a byte sent:
	// declared, they would hold 16 MiB, more than the 8 MiB budget; as they
	// arrive, a piece each.
	waiting := make(chan *httptest.ResponseRecorder, 64)
	for range 8 {
		go func() { waiting <- post("192.0.2.1", trickle(t), 2<<20) }()
	}
	// Another address's 1.5 MiB body fits beside them; so does the same
	// address's, within its 4 MiB. (Polled: the trickled bodies take their
	// pieces on goroutines of their own.)
	served := func(from string, size int) int {
		return post(from, io.NopCloser(strings.NewReader(strings.Repeat(" ", size))), int64(size)).Code
	}
	for _, from := range []string{"192.0.2.2", "192.0.2.1"} {
		if code := served(from, 3<<19); code != http.StatusOK {
			t.Errorf("a 1.5 MiB body from %s beside eight trickled 2 MiB bodies declared: %d, want 200", from, code)
		}
	}
	select {
	case w := <-waiting:
		t.Fatalf("a trickled body was answered %d before its bytes arrived", w.Code)
	default:
	}
	// Past its share an address gets 503 while another is served: 64
	// pieces of 64 KiB is the 4 MiB.
	for range 56 {
		go func() { waiting <- post("192.0.2.1", trickle(t), 2<<20) }()
	}
	deadline := time.Now().Add(time.Minute) // room for a starved scheduler
	for served("192.0.2.1", 1<<20) != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatal("an address holding 64 trickled bodies (its 4 MiB in pieces) was never refused a 1 MiB body")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code := served("192.0.2.3", 3<<19); code != http.StatusOK {
		t.Errorf("a 1.5 MiB body from another address beside one holding its share: %d, want 200", code)
	}
}

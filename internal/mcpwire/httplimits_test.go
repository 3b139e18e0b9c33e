package mcpwire_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
	h := mcpwire.HTTPMiddleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ }), 1<<20)
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

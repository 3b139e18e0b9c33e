package mcpwire_test

import (
	"io"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/internal/mcpwire"
)

type closeCounter struct {
	io.Reader
	closed int
}

func (c *closeCounter) Close() error { c.closed++; return nil }

// KeyReader is an mcp.IOTransport's Reader as it is: closing it closes the
// stream it wraps (stdin), and a plain reader is closed without error.
func TestKeyReaderClosesWhatItWraps(t *testing.T) {
	in := &closeCounter{Reader: strings.NewReader("{}\n")}
	r := mcpwire.KeyReader(in)
	if b, err := io.ReadAll(r); err != nil || string(b) != "{}\n" {
		t.Fatalf("read %q, %v", b, err)
	}
	if err := r.Close(); err != nil || in.closed != 1 {
		t.Fatalf("Close = %v, closed %d times, want once", err, in.closed)
	}
	if err := mcpwire.KeyReader(strings.NewReader("")).Close(); err != nil {
		t.Fatalf("closing a reader that is no Closer: %v", err)
	}
}

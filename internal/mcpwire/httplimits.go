package mcpwire

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/net/netutil"
)

// HTTPLimits bounds what the callers of a streamable HTTP MCP server can
// cost it before and while they are served: the memory of the bodies it
// reads, and the connections (file descriptors) a slow or idle caller
// holds. The zero value of a field takes its default.
type HTTPLimits struct {
	// MaxBodyBytes is the largest request body: a longer one gets 413,
	// refused by its Content-Length before it is read, or cut when the
	// reading reaches the limit. Defaults to DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// ReadHeaderTimeout bounds the reading of a request's headers.
	// Defaults to DefaultReadHeaderTimeout.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds the reading of a whole request, body included: a
	// body trickled slower is cut and its connection closed. Defaults to
	// DefaultReadTimeout.
	ReadTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle this long. Defaults
	// to DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxConnections bounds the connections served at once; more wait to
	// be accepted. Defaults to DefaultMaxConnections.
	MaxConnections int
	// MaxBufferedBytes bounds the bytes of request bodies held at once,
	// across requests (each up to MaxBodyBytes): a body that would pass it
	// gets 503 with Retry-After. A trickled body holds only what arrived;
	// one without a Content-Length (chunked) counts twice while its pieces
	// are joined. Defaults to DefaultMaxBufferedBytes.
	MaxBufferedBytes int64
}

// The HTTPLimits defaults.
const (
	// DefaultMaxBodyBytes is 4 MiB, the go-sdk's own limit
	// (mcp.DefaultMaxRequestBodyBytes).
	DefaultMaxBodyBytes = mcp.DefaultMaxRequestBodyBytes
	// DefaultReadHeaderTimeout is 10s.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultReadTimeout is 30s: a 4 MiB body at 140 KB/s.
	DefaultReadTimeout = 30 * time.Second
	// DefaultIdleTimeout is 2m.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultMaxConnections is 512, as the Dedupe service's -max-connections.
	DefaultMaxConnections = 512
	// DefaultMaxBufferedBytes is 256 MiB: 64 bodies of 4 MiB.
	DefaultMaxBufferedBytes = 256 << 20
)

// WithDefaults returns l with the default of every zero field.
func (l HTTPLimits) WithDefaults() HTTPLimits {
	if l.MaxBodyBytes == 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if l.ReadHeaderTimeout == 0 {
		l.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if l.ReadTimeout == 0 {
		l.ReadTimeout = DefaultReadTimeout
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.MaxBufferedBytes == 0 {
		l.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	return l
}

// Check refuses a negative limit, naming it by the flag that sets it
// (prefix and the field's flag name, such as "-max-body-bytes").
func (l HTTPLimits) Check(prefix string) error {
	switch {
	case l.MaxBodyBytes < 0:
		return fmt.Errorf("%smax-body-bytes must be positive, got %d", prefix, l.MaxBodyBytes)
	case l.ReadHeaderTimeout < 0:
		return fmt.Errorf("%sread-header-timeout must be positive, got %s", prefix, l.ReadHeaderTimeout)
	case l.ReadTimeout < 0:
		return fmt.Errorf("%sread-timeout must be positive, got %s", prefix, l.ReadTimeout)
	case l.IdleTimeout < 0:
		return fmt.Errorf("%sidle-timeout must be positive, got %s", prefix, l.IdleTimeout)
	case l.MaxConnections < 0:
		return fmt.Errorf("%smax-connections must be positive, got %d", prefix, l.MaxConnections)
	case l.MaxBufferedBytes < 0:
		return fmt.Errorf("%smax-buffered-bytes must be positive, got %d", prefix, l.MaxBufferedBytes)
	}
	// A chunked body counts twice while its pieces are joined: a budget
	// below that would answer 503 to the largest body for ever.
	if d := l.WithDefaults(); d.MaxBufferedBytes < 2*d.MaxBodyBytes {
		return fmt.Errorf("%smax-buffered-bytes (%d) must be at least twice %smax-body-bytes (%d): a chunked body is held twice while it is joined", prefix, d.MaxBufferedBytes, prefix, d.MaxBodyBytes)
	}
	return nil
}

// Server returns an http.Server serving h with l's timeouts (no write
// timeout: a gated call may take its execution timeout to answer).
func (l HTTPLimits) Server(h http.Handler) *http.Server {
	l = l.WithDefaults()
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeaderTimeout, ReadTimeout: l.ReadTimeout, IdleTimeout: l.IdleTimeout}
}

// Listener returns lis accepting at most l.MaxConnections connections at
// once.
func (l HTTPLimits) Listener(lis net.Listener) net.Listener {
	return netutil.LimitListener(lis, l.WithDefaults().MaxConnections)
}

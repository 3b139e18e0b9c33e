package mcpwire

import (
	"fmt"
	"net"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/internal/httplimits"
)

// HTTPLimits bounds what the callers of a streamable HTTP MCP server can
// cost it before and while they are served: the memory of the bodies it
// reads and of the answers it writes, and the connections (file descriptors) a slow, idle or
// never-reading caller holds (httplimits.Limits: timeouts, and connection
// caps in total and per client address). The zero value of a field takes
// its default.
type HTTPLimits struct {
	httplimits.Limits
	// MaxBodyBytes is the largest request body: a longer one gets 413,
	// refused by its Content-Length before it is read, or cut when the
	// reading reaches the limit. Defaults to DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxBufferedBytes bounds the bytes of request bodies held at once,
	// across requests (each up to MaxBodyBytes): a body that would pass it
	// gets 503 with Retry-After. A body holds what arrived, whatever its
	// Content-Length declares: its buffer doubles as bytes arrive (at most
	// twice what arrived, or 64 KiB; never more than one and a half times
	// its length), and one without a Content-Length (chunked) counts twice
	// while its pieces are joined. Defaults to DefaultMaxBufferedBytes.
	MaxBufferedBytes int64
	// MaxBufferedBytesPerIP bounds the bytes of request bodies one client
	// address (httplimits.IPGroup: an IPv6 one's /64) holds at once, within
	// MaxBufferedBytes, so one client trickling bodies on every connection
	// it may open leaves the others room: a body that would pass it gets
	// 503 with Retry-After. Clients behind one proxy share it. At least
	// twice MaxBodyBytes. Defaults to DefaultMaxBufferedBytesPerIP.
	MaxBufferedBytesPerIP int64
	// MaxAnswerBytes bounds the bytes of tools/call answers held at once,
	// across requests, from when a tool's result is ready until its HTTP
	// response is written, or the write fails (a caller that reads nothing
	// is dropped after WriteTimeout): a result that would pass it is not
	// held, and the call is answered ReasonAnswerBudgetExhausted instead
	// (HoldAnswers: the server's tools/call results must go through it, as
	// the bridge's and mcpgate's do, and its streamable handler must be
	// stateless, as HTTPHandler's is). An answer counts its size
	// (AnswerSize). Defaults to DefaultMaxAnswerBytes.
	MaxAnswerBytes int64
	// MaxAnswerBytesPerIP bounds the bytes of answers one client address
	// (httplimits.IPGroup: an IPv6 one's /64) holds at once, within
	// MaxAnswerBytes, so callers that never read their answers from one
	// address leave the others room. Clients behind one proxy share it. An
	// answer larger than it is never held (ReasonAnswerTooLarge). Defaults
	// to DefaultMaxAnswerBytesPerIP.
	MaxAnswerBytesPerIP int64
}

// The HTTPLimits defaults.
const (
	// DefaultMaxBodyBytes is 4 MiB, the go-sdk's own limit
	// (mcp.DefaultMaxRequestBodyBytes).
	DefaultMaxBodyBytes = mcp.DefaultMaxRequestBodyBytes
	// DefaultReadHeaderTimeout is httplimits.DefaultReadHeaderTimeout, 10s.
	DefaultReadHeaderTimeout = httplimits.DefaultReadHeaderTimeout
	// DefaultReadTimeout is httplimits.DefaultReadTimeout, 30s.
	DefaultReadTimeout = httplimits.DefaultReadTimeout
	// DefaultIdleTimeout is httplimits.DefaultIdleTimeout, 2m.
	DefaultIdleTimeout = httplimits.DefaultIdleTimeout
	// DefaultMaxConnections is httplimits.DefaultMaxConnections, 512.
	DefaultMaxConnections = httplimits.DefaultMaxConnections
	// DefaultMaxBufferedBytes is 256 MiB: 64 bodies of 4 MiB.
	DefaultMaxBufferedBytes = 256 << 20
	// DefaultMaxBufferedBytesPerIP is 32 MiB: an eighth of
	// DefaultMaxBufferedBytes, as DefaultMaxConnectionsPerIP is of
	// DefaultMaxConnections; 4 bodies of 4 MiB being joined.
	DefaultMaxBufferedBytesPerIP = 32 << 20
	// DefaultMaxAnswerBytes is 256 MiB of answers being written, as
	// DefaultMaxBufferedBytes is of bodies being read: 32 answers of the
	// largest a bridge forwards (gRPC's default 4 MiB response, written
	// twice, as text and as structuredContent).
	DefaultMaxAnswerBytes = 256 << 20
	// DefaultMaxAnswerBytesPerIP is 32 MiB: an eighth of
	// DefaultMaxAnswerBytes, as DefaultMaxBufferedBytesPerIP is of
	// DefaultMaxBufferedBytes; 4 of the largest answers, or thousands of
	// ordinary ones.
	DefaultMaxAnswerBytesPerIP = 32 << 20
)

// WithDefaults returns l with the default of every zero field.
func (l HTTPLimits) WithDefaults() HTTPLimits {
	l.Limits = l.Limits.WithDefaults()
	if l.MaxBodyBytes == 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if l.MaxBufferedBytes == 0 {
		l.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if l.MaxBufferedBytesPerIP == 0 {
		l.MaxBufferedBytesPerIP = DefaultMaxBufferedBytesPerIP
	}
	if l.MaxAnswerBytes == 0 {
		l.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
	if l.MaxAnswerBytesPerIP == 0 {
		l.MaxAnswerBytesPerIP = DefaultMaxAnswerBytesPerIP
	}
	return l
}

// Check refuses a negative limit, naming it by the flag that sets it
// (prefix and the field's flag name, such as "-max-body-bytes").
func (l HTTPLimits) Check(prefix string) error {
	if err := l.Limits.Check(prefix); err != nil {
		return err
	}
	switch {
	case l.MaxBodyBytes < 0:
		return fmt.Errorf("%smax-body-bytes must be positive, got %d", prefix, l.MaxBodyBytes)
	case l.MaxBufferedBytes < 0:
		return fmt.Errorf("%smax-buffered-bytes must be positive, got %d", prefix, l.MaxBufferedBytes)
	case l.MaxBufferedBytesPerIP < 0:
		return fmt.Errorf("%smax-buffered-bytes-per-ip must be positive, got %d", prefix, l.MaxBufferedBytesPerIP)
	case l.MaxAnswerBytes < 0:
		return fmt.Errorf("%smax-answer-bytes must be positive, got %d", prefix, l.MaxAnswerBytes)
	case l.MaxAnswerBytesPerIP < 0:
		return fmt.Errorf("%smax-answer-bytes-per-ip must be positive, got %d", prefix, l.MaxAnswerBytesPerIP)
	}
	// A chunked body counts twice while its pieces are joined: a budget
	// below that would answer 503 to the largest body for ever.
	d := l.WithDefaults()
	if d.MaxBufferedBytes < 2*d.MaxBodyBytes {
		return fmt.Errorf("%smax-buffered-bytes (%d) must be at least twice %smax-body-bytes (%d): a chunked body is held twice while it is joined", prefix, d.MaxBufferedBytes, prefix, d.MaxBodyBytes)
	}
	if d.MaxBufferedBytesPerIP < 2*d.MaxBodyBytes {
		return fmt.Errorf("%smax-buffered-bytes-per-ip (%d) must be at least twice %smax-body-bytes (%d): a chunked body is held twice while it is joined", prefix, d.MaxBufferedBytesPerIP, prefix, d.MaxBodyBytes)
	}
	return nil
}

// Server returns an http.Server serving h with l's timeouts
// (httplimits.Limits.Server).
func (l HTTPLimits) Server(h http.Handler) *http.Server { return l.Limits.Server(h) }

// Listener returns lis within l's connection caps
// (httplimits.Limits.Listener).
func (l HTTPLimits) Listener(lis net.Listener) net.Listener { return l.Limits.Listener(lis) }

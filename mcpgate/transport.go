package mcpgate

import (
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/internal/mcpwire"
)

// HTTPHandler serves server over streamable HTTP, stateless, wrapped in
// HTTPMiddleware: mcp.NewStreamableHTTPHandler with
// StreamableHTTPOptions{Stateless: true} and the SDK's other defaults. Every
// POST is served on its own temporary session and no Mcp-Session-Id is
// issued; GET and DELETE get 405. Stateless is what the go-sdk needs to
// serve protocol version 2026-07-28 over HTTP (a stateful handler refuses
// it); clients of earlier versions initialize and call as before. The gate
// keeps nothing in a session: a gated call needs only its own request (its
// key, arguments and token). To serve with other options, wrap your own
// handler in HTTPMiddleware. A body over 4 MiB (the SDK's
// DefaultMaxRequestBodyBytes; WithMaxBodyBytes) gets 413, before it is
// read when its Content-Length says so; past 256 MiB of bodies held at
// once (32 MiB for one client address; WithMaxBufferedBytes), a body gets
// 503 with Retry-After. A tools/call result is held until it is written,
// within 256 MiB of results at once and 32 MiB for one client address
// (WithMaxAnswerBytes; so callers that never read theirs cannot take the
// server's memory): past it the call is answered
// ReasonAnswerBudgetExhausted. Limits that cannot work panic. Serve it from an http.Server with ReadTimeout,
// ReadHeaderTimeout and IdleTimeout set and a bounded listener (as
// examples/mcp-server does): the handler cannot bound how long a caller
// holds a connection.
func HTTPHandler(server *mcp.Server, opts ...HTTPOption) http.Handler {
	return mcpwire.HTTPHandler(server, httpLimits(opts))
}

// HTTPOption sets a limit of HTTPHandler and HTTPMiddleware. Without one,
// each limit takes its default.
type HTTPOption func(*mcpwire.HTTPLimits)

// WithMaxBodyBytes sets the largest request body: a longer one gets 413,
// before it is read when its Content-Length says so. HTTPHandler gives the
// SDK's handler the same limit; with HTTPMiddleware, give your handler's
// StreamableHTTPOptions.MaxRequestBodyBytes the same n. Defaults to 4 MiB,
// the SDK's DefaultMaxRequestBodyBytes. The buffered-bytes budgets must
// stay at least twice n (a chunked body is held twice while it is joined).
func WithMaxBodyBytes(n int64) HTTPOption {
	return func(l *mcpwire.HTTPLimits) { l.MaxBodyBytes = n }
}

// WithMaxBufferedBytes bounds the request bodies held at once: total
// across every client, perAddress for one client address (an IPv6 one's
// /64; the clients behind one proxy share it). A body that would pass
// either gets 503 with Retry-After. A body counts the bytes that arrived,
// not the length it declares. 0 keeps a default: 256 MiB in total, 32 MiB
// per address.
func WithMaxBufferedBytes(total, perAddress int64) HTTPOption {
	return func(l *mcpwire.HTTPLimits) { l.MaxBufferedBytes, l.MaxBufferedBytesPerIP = total, perAddress }
}

// WithMaxAnswerBytes bounds the tools/call results held from when they are
// ready until their HTTP response is written: total across every client,
// perAddress for one client address, so callers that never read their
// answers cannot take the server's memory. A result past either is not
// held: the call is answered ReasonAnswerBudgetExhausted (the call ran; the
// same key replays its outcome), or ReasonAnswerTooLarge when it is larger
// than perAddress. Needs a stateless handler, as HTTPHandler's is. 0 keeps
// a default: 256 MiB in total, 32 MiB per address.
func WithMaxAnswerBytes(total, perAddress int64) HTTPOption {
	return func(l *mcpwire.HTTPLimits) { l.MaxAnswerBytes, l.MaxAnswerBytesPerIP = total, perAddress }
}

// httpLimits applies opts, and panics on limits that cannot work (a
// negative one, a budget below twice the body limit): a handler built with
// them would refuse its largest bodies for ever.
func httpLimits(opts []HTTPOption) mcpwire.HTTPLimits {
	var l mcpwire.HTTPLimits
	for _, o := range opts {
		o(&l)
	}
	if err := l.Check(""); err != nil {
		panic("mcpgate: " + strings.NewReplacer("-max-body-bytes", "WithMaxBodyBytes", "-max-buffered-bytes-per-ip", "WithMaxBufferedBytes's perAddress",
			"-max-buffered-bytes", "WithMaxBufferedBytes's total", "-max-answer-bytes-per-ip", "WithMaxAnswerBytes's perAddress",
			"-max-answer-bytes", "WithMaxAnswerBytes's total").Replace(err.Error()))
	}
	return l
}

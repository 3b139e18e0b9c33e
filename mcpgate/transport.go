package mcpgate

import (
	"net/http"

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
// DefaultMaxRequestBodyBytes) gets 413, before it is read when its
// Content-Length says so; past 256 MiB of bodies held at once, a body gets
// 503 with Retry-After. A tools/call result is held until it is written,
// within 256 MiB of results at once and 32 MiB for one client address (so
// callers that never read theirs cannot take the server's memory): past
// it the call is answered ReasonAnswerBudgetExhausted. Serve it from an http.Server with ReadTimeout,
// ReadHeaderTimeout and IdleTimeout set and a bounded listener (as
// examples/mcp-server does): the handler cannot bound how long a caller
// holds a connection.
func HTTPHandler(server *mcp.Server) http.Handler {
	return mcpwire.HTTPHandler(server, mcpwire.HTTPLimits{})
}

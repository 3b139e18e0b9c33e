// Package mcpwire is what every idemgate MCP server puts on the wire the
// same way: the _meta members that carry the idempotency key, the replay
// mark and the refusal, SEP-3182's idempotencyKey parameter lifted past the
// Go SDK (which drops unknown tools/call params), the capability advertised
// on initialize and server/discover, the stateless streamable HTTP handler
// that serves protocol version 2026-07-28, the resultType that version needs
// on results answered in middleware, and the error result with its advice. The bridge (internal/mcpbridge) and
// the native middleware (mcpgate) both use it, so an MCP client sees one
// protocol whichever serves the tool.
package mcpwire

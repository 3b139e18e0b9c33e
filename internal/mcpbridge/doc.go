// Package mcpbridge serves the methods of gated gRPC tool servers as MCP
// tools: each method becomes a tool whose input schema is generated from its
// request message (protojson names) and whose annotations come from the
// method's idemgate policy; a tools/call is forwarded as a unary gRPC call
// with the caller's idempotency key in the "idempotency-key" metadata, and
// the response (or the refusal, with its stable reason) comes back as a
// CallToolResult, replays marked in _meta.
//
// The bridge decides nothing about deduplication: the tool server's gate
// does. It only carries the key from MCP to gRPC and the outcome back, so it
// depends on the gate's wire protocol (metadata names, ErrorInfo reasons),
// never on its code.
//
// Where the key comes from, in order: _meta["io.idemgate/idempotency-key"]
// of the tools/call request, then SEP-3182's idempotencyKey parameter of
// tools/call. The official Go SDK drops members of tools/call params it does
// not know, so the second carrier reaches the bridge only through
// WrapTransport (stdio) or HTTPMiddleware (streamable HTTP), which move it
// into _meta before the SDK decodes the request.
//
// Callers authenticated by CallerAuth share the bridge's one identity at the
// tool server, so its gate sees them as one tenant: the bridge forwards
// such a caller's key as "<name>/<key>" (in the metadata, and in the
// request's idempotency_key field when the call set it there) and refuses
// its keyless calls to gated tools, so no caller is answered with another's
// outcome. A call without a caller (stdio, HTTP without CallerAuth) is
// forwarded as sent.
package mcpbridge

// Package mcpgate makes the gated tools of an MCP server written with the
// official Go SDK (github.com/modelcontextprotocol/go-sdk) run once per
// idempotency key: it is receiving middleware on tools/call that reserves
// the key with the idemgate Dedupe service, runs the tool once, stores its
// CallToolResult and replays it, byte for byte, to every duplicate.
//
//	server := mcp.NewServer(&mcp.Implementation{Name: "payments"}, nil)
//	mcp.AddTool(server, chargeTool, charge)
//	gate, err := mcpgate.New(ctx, dedupe, server) // lists the tools, adds the middleware
//	...
//	defer gate.Close(ctx)
//
// The semantics are the gRPC interceptor's (package interceptor), through
// the same transport-free core: Begin, lease renewal while the tool runs,
// Finish or Release retried in the background, a lost Begin followed up,
// FAIL_CLOSED or REEXECUTE after a lost outcome, duplicates that wait for an
// in-flight original, and fencing. Refusals carry the same reasons
// (IDEMPOTENCY_KEY_MISSING, IDEMPOTENCY_KEY_REUSED, IDEMPOTENCY_IN_FLIGHT
// with a retry delay, IDEMPOTENCY_OUTCOME_UNKNOWN, ...), as a tool result
// with isError and _meta["io.idemgate/error"], as the idemgate MCP bridge
// sends them.
//
// Which tools are gated: a tool named with WithTool follows that policy;
// any other follows its annotations: readOnlyHint or idempotentHint true is
// never gated, anything else (MCP's defaults: not read-only, not idempotent,
// also a tool without annotations) is gated. WithStrict refuses a tool that
// is neither named nor annotated.
//
// The key, in this order: _meta["io.idemgate/idempotency-key"] of the
// tools/call request, then the argument the tool's input schema marks with
// "io.idemgate/idempotency-key": true (or ToolPolicy.KeyArgument), then
// SEP-3182's idempotencyKey parameter (which reaches the middleware only
// through KeyReader on stdio or HTTPMiddleware on streamable HTTP, since
// the SDK drops unknown tools/call params). Two carriers with different
// keys are IDEMPOTENCY_KEY_CONFLICT; no key is IDEMPOTENCY_KEY_MISSING
// unless the tool's policy deduplicates keyless calls on their arguments.
//
// The fingerprint that tells a retry from another action with the same key
// is the SHA-256 of the arguments in RFC 8785 canonical JSON, without the
// key argument and the arguments marked "io.idemgate/exclude-from-fingerprint".
//
// The tenant, which namespaces keys, is the caller's authenticated identity
// (TokenTenant: the bearer token's user). Over stdio the one client is the
// one tenant; over HTTP a gated call without an identity is refused
// UNAUTHENTICATED (ReasonUnauthenticated), since every such caller would
// share one tenant and be replayed another's result, unless the server says
// it has one tenant (WithSingleTenant).
//
// What one call costs the gate is bounded: arguments over
// WithMaxArgumentBytes (4 MiB) are refused before they are parsed, a call
// without a key (or, over HTTP, without an identity) before its arguments
// are fingerprinted, and the fingerprint takes time linear in the arguments'
// size (n log n in the members of each object).
//
// The handler runs on a context that keeps the caller's values but not its
// cancellation: a client that gives up (or cancels) after the tool started
// never causes a second run; its retry waits for the outcome or replays it.
//
// Serve the server over stdio (with KeyReader) or over HTTPHandler's
// stateless streamable HTTP: both speak protocol version 2026-07-28
// (server/discover, no session) and the earlier versions (initialize). The
// gate keeps nothing in a session, and advertises the capability
// CapabilityName on the initialize and the server/discover results.
package mcpgate

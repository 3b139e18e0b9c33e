package mcpbridge

import (
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"

	"github.com/idemgate/idemgate/internal/mcpwire"
)

// The wire names the bridge shares with every idemgate MCP server
// (internal/mcpwire, mcpgate).
const (
	// MetaKey is the _meta member of a tools/call request that carries the
	// idempotency key: the carrier every MCP client can set.
	MetaKey = mcpwire.MetaKey
	// MetaReplayed is the _meta member of a CallToolResult that says whether
	// the result is the stored outcome of an earlier call with the key (true)
	// or of this call (false). Set on every result of a successful call.
	MetaReplayed = mcpwire.MetaReplayed
	// MetaKeyDerived is the _meta member set to true when the tool server
	// deduplicated a keyless call on its fingerprint (keyless FINGERPRINT).
	MetaKeyDerived = mcpwire.MetaKeyDerived
	// MetaError is the _meta member of an error result: an object with the
	// gRPC code name ("FAILED_PRECONDITION"), the ErrorInfo reason, domain and
	// metadata, the message, and the RetryInfo delay as retryAfterSeconds
	// when the tool server sent one.
	MetaError = mcpwire.MetaError
	// ParamKey is SEP-3182's tools/call parameter carrying the key (a
	// proposal, not part of the MCP specification).
	ParamKey = mcpwire.ParamKey
	// DefaultKeyArgument is the name suggested for Config.KeyArgument:
	// "idempotency_key".
	DefaultKeyArgument = mcpwire.DefaultKeyArgument
	// CapabilityName names the idempotency capability the bridge advertises
	// on the initialize and the server/discover results, with the settings
	// {"metaKey": MetaKey, "param": ParamKey}: in capabilities.experimental
	// (clients before 2026-07-28) and as the extension identifier in
	// capabilities.extensions (2026-07-28), next to SEP-3182's
	// capabilities.tools.idempotency.
	CapabilityName = mcpwire.CapabilityName
	// ReasonArgumentsInvalid is the ErrorInfo reason of a tool call whose
	// arguments do not parse as the method's request message (protojson).
	// INVALID_ARGUMENT; nothing was sent to the tool server. Fix the
	// arguments.
	ReasonArgumentsInvalid = mcpwire.ReasonArgumentsInvalid
	// ReasonAnswerBudgetExhausted is the ErrorInfo reason of a call that
	// ran but whose answer the bridge did not hold over HTTP: the answers
	// being written held mcpwire.HTTPLimits.MaxAnswerBytes, or
	// MaxAnswerBytesPerIP for the caller's address. RESOURCE_EXHAUSTED with
	// RetryInfo; a retry with the same key replays the stored outcome.
	ReasonAnswerBudgetExhausted = mcpwire.ReasonAnswerBudgetExhausted
	// ReasonAnswerTooLarge is the ErrorInfo reason of a call that ran but
	// whose answer is larger than the bridge holds for one caller over
	// HTTP. RESOURCE_EXHAUSTED; a retry gets the same refusal.
	ReasonAnswerTooLarge = mcpwire.ReasonAnswerTooLarge
)

// Advice values: what a caller does with an error, by its reason (see
// mcpwire).
const (
	// AdviceRetrySameKey: retry with the same key; it gets the action's
	// outcome without running it twice.
	AdviceRetrySameKey = mcpwire.AdviceRetrySameKey
	// AdviceFixRequest: the request is malformed; fix it and call again.
	AdviceFixRequest = mcpwire.AdviceFixRequest
	// AdviceEscalate: nothing a retry or a new key can fix (the outcome is
	// unknown, the key names another action); hand it to a human.
	AdviceEscalate = mcpwire.AdviceEscalate
)

// Advice returns what a caller does with an error of the reason (and code,
// for errors without an idemgate reason): one of the Advice values, or ""
// when the error is the tool's own.
func Advice(reason string, code codes.Code) string { return mcpwire.Advice(reason, code) }

// KeyReader wraps the input of a newline-delimited JSON-RPC stream (an MCP
// server's stdin) so that SEP-3182's idempotencyKey parameter of every
// tools/call reaches the bridge: use it as the Reader of an mcp.IOTransport.
// Every other message passes through unchanged.
func KeyReader(r io.Reader) io.ReadCloser { return mcpwire.KeyReader(r) }

// HTTPMiddleware wraps a streamable HTTP MCP handler so that SEP-3182's
// idempotencyKey parameter of a tools/call POSTed to it reaches the bridge.
// It reads the body, within l's MaxBodyBytes and MaxBufferedBytes
// (mcpwire.HTTPMiddleware), and hands the handler the rewritten one; the
// bridge's answers to the request are held within l's MaxAnswerBytes and
// MaxAnswerBytesPerIP until its response is written.
func HTTPMiddleware(next http.Handler, l mcpwire.HTTPLimits) http.Handler {
	return mcpwire.HTTPMiddleware(next, l)
}

func codeName(c codes.Code) string { return mcpwire.CodeName(c) }

// HTTPHandler serves a bridge (New's server) over streamable HTTP,
// stateless, wrapped in HTTPMiddleware: every POST is served on its own
// temporary session, no Mcp-Session-Id is issued, GET and DELETE get 405.
// That is what the go-sdk needs to serve protocol version 2026-07-28 over
// HTTP; clients of earlier versions initialize and call as before. The
// bridge keeps nothing in a session: each call is forwarded with its own
// key. l bounds the bodies (mcpwire.HTTPHandler): one over MaxBodyBytes
// gets 413, before it is read when its Content-Length says so; and the
// answers being written (MaxAnswerBytes, MaxAnswerBytesPerIP): an answer
// past them is not held, and its call is answered
// ReasonAnswerBudgetExhausted.
// idemgate-mcp -listen serves it at /mcp.
func HTTPHandler(server *mcp.Server, l mcpwire.HTTPLimits) http.Handler {
	return mcpwire.HTTPHandler(server, l)
}

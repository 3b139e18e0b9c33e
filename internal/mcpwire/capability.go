package mcpwire

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// CapabilitySettings returns the settings object of the idempotency
// capability: {"metaKey": MetaKey, "param": ParamKey}, the _meta member and
// SEP-3182's tools/call parameter that carry the key. A new map each call.
func CapabilitySettings() map[string]any {
	return map[string]any{"metaKey": MetaKey, "param": ParamKey}
}

// Capabilities returns the server capabilities to advertise: tools, and
// CapabilityName with CapabilitySettings in both experimental (read by
// clients before 2026-07-28) and extensions (2026-07-28). Pass it in
// mcp.ServerOptions; AdvertiseIdempotency adds the rest (SEP-3182's
// tools.idempotency) and the same entries to a server built without it.
func Capabilities() *mcp.ServerCapabilities {
	return &mcp.ServerCapabilities{
		Tools:        &mcp.ToolCapabilities{},
		Experimental: map[string]any{CapabilityName: CapabilitySettings()},
		Extensions:   map[string]any{CapabilityName: CapabilitySettings()},
	}
}

// AdvertiseIdempotency is receiving middleware that advertises the
// idempotency capability where a client of any version reads the server's
// capabilities: on the initialize result (before 2026-07-28) and on the
// server/discover result (2026-07-28, SEP-2575). It adds CapabilityName with
// CapabilitySettings to capabilities.experimental and
// capabilities.extensions, keeping the server's other entries, and
// SEP-3182's capabilities.tools.idempotency = {}, which the SDK's typed
// capabilities have no field for. Every other result passes unchanged.
func AdvertiseIdempotency(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if err != nil {
			return res, err
		}
		switch r := res.(type) {
		case *mcp.InitializeResult:
			if method == "initialize" {
				out := *r
				out.Capabilities = withCapability(r.Capabilities)
				return initializeResult{&out}, nil
			}
		case *mcp.DiscoverResult:
			if method == "server/discover" {
				out := *r
				out.Capabilities = withCapability(r.Capabilities)
				return discoverResult{&out}, nil
			}
		}
		return res, nil
	}
}

// withCapability returns a copy of caps (nil: none) with CapabilityName in
// experimental and extensions; caps is not modified.
func withCapability(caps *mcp.ServerCapabilities) *mcp.ServerCapabilities {
	out := mcp.ServerCapabilities{}
	if caps != nil {
		out = *caps
	}
	out.Experimental = maps.Clone(out.Experimental)
	if out.Experimental == nil {
		out.Experimental = map[string]any{}
	}
	out.Experimental[CapabilityName] = CapabilitySettings()
	out.Extensions = maps.Clone(out.Extensions)
	if out.Extensions == nil {
		out.Extensions = map[string]any{}
	}
	out.Extensions[CapabilityName] = CapabilitySettings()
	return &out
}

// initializeResult is an InitializeResult that marshals with
// capabilities.tools.idempotency.
type initializeResult struct{ *mcp.InitializeResult }

// MarshalJSON writes the result with capabilities.tools.idempotency.
func (r initializeResult) MarshalJSON() ([]byte, error) {
	return withToolsIdempotency(r.InitializeResult)
}

// discoverResult is a DiscoverResult that marshals with
// capabilities.tools.idempotency.
type discoverResult struct{ *mcp.DiscoverResult }

// MarshalJSON writes the result with capabilities.tools.idempotency.
func (r discoverResult) MarshalJSON() ([]byte, error) { return withToolsIdempotency(r.DiscoverResult) }

// withToolsIdempotency marshals result (an object with a capabilities
// member) with capabilities.tools.idempotency = {}.
func withToolsIdempotency(result any) ([]byte, error) {
	b, err := json.Marshal(result)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	caps, _ := m["capabilities"].(map[string]any)
	if caps == nil {
		caps = map[string]any{}
		m["capabilities"] = caps
	}
	tools, _ := caps["tools"].(map[string]any)
	if tools == nil {
		tools = map[string]any{}
		caps["tools"] = tools
	}
	tools["idempotency"] = map[string]any{}
	return json.Marshal(m)
}

// HTTPHandler serves server over streamable HTTP, stateless: every POST is
// served on its own temporary session, no Mcp-Session-Id is issued or read,
// and GET and DELETE get 405. Stateless is what the go-sdk needs to serve
// protocol version 2026-07-28 over HTTP (a stateful handler refuses it);
// clients of earlier versions still initialize and call as before. Wrapped
// in HTTPMiddleware, so SEP-3182's idempotencyKey parameter reaches the
// server, with l's body limits (MaxBodyBytes, MaxBufferedBytes) and answer
// budget (MaxAnswerBytes, for the server's results that pass through
// HoldAnswers); its zero fields take their defaults. The SDK's other
// defaults hold (DNS rebinding protection for localhost, SSE responses).
func HTTPHandler(server *mcp.Server, l HTTPLimits) http.Handler {
	l = l.WithDefaults()
	return HTTPMiddleware(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, MaxRequestBodyBytes: l.MaxBodyBytes}), l)
}

// KeyHeaderName is the header name (SEP-2243's x-mcp-header) a tool's key
// argument is annotated with, so that a streamable HTTP client at
// 2026-07-28 mirrors the argument's value into the request header
// Mcp-Param-Idempotency-Key. For a tool registered with the annotation (the
// bridge's) the go-sdk server refuses a request whose header and argument
// differ (-32020, header mismatch); for the argument mcpgate adds to a
// listed schema, mcpgate checks it. Only an argument is mirrored: the key in
// _meta[MetaKey] never is.
const KeyHeaderName = "Idempotency-Key"

// KeyHeaderAnnotation returns the member to add to the key argument's
// property in a tool's input schema: {"x-mcp-header": KeyHeaderName}. The
// property must be a string (the SDK also allows integer and boolean, and
// refuses any other type when the tool is added). A new map each call.
func KeyHeaderAnnotation() map[string]any { return map[string]any{"x-mcp-header": KeyHeaderName} }

package mcpwire

import (
	"context"
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// protocolStateless is the first protocol version whose results carry
// resultType (SEP-2322) and whose requests need no session (SEP-2575).
const protocolStateless = "2026-07-28"

// MarkComplete is receiving middleware for a server that answers tools/call
// in middleware (mcpgate's refusals and replays): from protocol version
// 2026-07-28 on, every result carries resultType, "complete" unless it asks
// for input, and a client of that version refuses one without it (SEP-2322).
// The SDK sets it only on what a tool handler returns; MarkComplete sets
// resultType "complete" on every tools/call result that has none, when the
// request's session negotiated 2026-07-28 or later, in a wrapper (a
// *mcp.CallToolResult that already has one, as tool handlers' results do,
// passes as it is). Every other result, and every result at an earlier
// version, passes unchanged.
func MarkComplete(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if err != nil || res == nil || method != "tools/call" || !statelessSession(req) {
			return res, err
		}
		if r, ok := res.(*mcp.CallToolResult); ok && hasResultType(r) {
			// A tool handler's result, which the SDK marked: handed on as
			// the *mcp.CallToolResult middleware outside expects.
			return res, nil
		}
		return completeResult{res}, nil
	}
}

// statelessSession reports whether the request's session negotiated
// protocol version 2026-07-28 or later.
func statelessSession(req mcp.Request) bool {
	ss, ok := req.GetSession().(*mcp.ServerSession)
	if !ok || ss == nil {
		return false
	}
	p := ss.InitializeParams()
	return p != nil && p.ProtocolVersion >= protocolStateless
}

// hasResultType reports whether r marshals with a resultType.
func hasResultType(r *mcp.CallToolResult) bool {
	b, err := json.Marshal(r)
	if err != nil {
		return false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil {
		return false
	}
	_, ok := m["resultType"]
	return ok
}

// completeResult is a result that marshals with resultType "complete" when
// it has no resultType of its own.
type completeResult struct{ mcp.Result }

// MarshalJSON writes the result with resultType "complete" when it has none.
func (r completeResult) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(r.Result)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if _, ok := m["resultType"]; ok {
		return b, nil
	}
	m["resultType"] = json.RawMessage(`"complete"`)
	return json.Marshal(m)
}

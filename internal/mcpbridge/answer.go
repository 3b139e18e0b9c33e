package mcpbridge

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"unicode/utf8"
	"unsafe"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// answer is a successful result of the bridge, encoded once. Its text and
// its structuredContent are one copy of the response's JSON (js): the
// handler's TextContent shares js's bytes rather than copying them into a
// string, and MarshalJSON writes the result into one buffer of its exact
// size, js escaped as the text and js as it is, rather than the SDK's
// marshalling (the text escaped into one buffer, that copied into the
// result's, that copied again). The SDK then frames that buffer (a copy for
// the JSON-RPC result, one for the message, one for the SSE event).
//
// The embedded result is the handler's: the SDK sets the members it adds
// after the handler (resultType, _meta's server identity) on it, and
// MarshalJSON writes them, and its other members, as the SDK does.
type answer struct {
	*mcp.CallToolResult
	js         []byte
	structured bool
}

// encodeOnce is receiving middleware that makes each successful tools/call
// result of the bridge's handler (textResult's) an answer; any other result
// passes as it is.
func encodeOnce(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if err != nil || method != "tools/call" {
			return res, err
		}
		if a := asAnswer(res); a != nil {
			return a, nil
		}
		return res, nil
	}
}

// textResult is the result of a successful call: its one content is the
// response's JSON as text, sharing js's bytes (string(js) would copy them;
// js is never changed after), and, for a response that is a JSON object,
// its structuredContent is js too.
func textResult(js []byte, structured bool) *mcp.CallToolResult {
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: unsafe.String(unsafe.SliceData(js), len(js))}}}
	if structured {
		res.StructuredContent = json.RawMessage(js)
	}
	return res
}

// asAnswer returns res as an answer when it is textResult's, with nothing
// else but _meta and what the SDK sets; nil otherwise.
func asAnswer(res mcp.Result) *answer {
	r, ok := res.(*mcp.CallToolResult)
	if !ok || r == nil || r.IsError || len(r.Content) != 1 || r.InputRequests != nil || r.RequestState != "" {
		return nil
	}
	t, ok := r.Content[0].(*mcp.TextContent)
	if !ok || t.Meta != nil || t.Annotations != nil {
		return nil
	}
	js := unsafe.Slice(unsafe.StringData(t.Text), len(t.Text))
	switch s := r.StructuredContent.(type) {
	case nil:
		return &answer{CallToolResult: r, js: js}
	case json.RawMessage:
		if unsafe.SliceData(s) == unsafe.SliceData(js) && len(s) == len(js) {
			return &answer{CallToolResult: r, js: js, structured: true}
		}
	}
	return nil
}

// The members an answer writes itself, around js.
const (
	answerText       = `{"content":[{"type":"text","text":`
	answerStructured = `}],"structuredContent":`
	answerEnd        = `}]`
)

// AnswerSize is the answer's size, but for the few members the SDK adds
// (resultType, _meta): what the answer budget counts
// (mcpwire.HoldAnswers).
func (a *answer) AnswerSize() int64 {
	n := len(answerText) + quotedLen(a.js) + len(answerEnd) + 1
	if a.structured {
		n += len(answerStructured) - len(answerEnd) + len(a.js)
	}
	return int64(n)
}

// MarshalJSON writes the answer, js once as the text and once as the
// structuredContent, and the result's other members as the SDK marshals
// them, in one buffer of the answer's size.
func (a *answer) MarshalJSON() ([]byte, error) {
	// The other members, marshalled by the SDK without the large ones
	// (small); content, which it always writes, is left out.
	rest := *a.CallToolResult
	rest.Content, rest.StructuredContent = nil, nil
	small, err := json.Marshal(&rest)
	if err != nil {
		return nil, err
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(small, &members); err != nil {
		return nil, err
	}
	delete(members, "content")
	names := slices.Sorted(maps.Keys(members))
	size := int(a.AnswerSize())
	for _, k := range names {
		size += len(k) + 4 + len(members[k]) // ,"k":v
	}
	b := make([]byte, 0, size)
	b = append(b, answerText...)
	b = appendQuoted(b, a.js)
	if a.structured {
		b = append(b, answerStructured...)
		b = append(b, a.js...)
	} else {
		b = append(b, answerEnd...)
	}
	for _, k := range names {
		b = append(b, ',', '"')
		b = append(b, k...) // a member name of the SDK's: no escaping
		b = append(b, '"', ':')
		b = append(b, members[k]...)
	}
	return append(b, '}'), nil
}

// quotedLen is the length of appendQuoted's encoding of s.
func quotedLen(s []byte) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
				n += 2
			case c < 0x20:
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			n += 6 // \ufffd
		} else {
			n += size
		}
		i += size
	}
	return n
}

// appendQuoted appends s as a JSON string: '"' and '\\' escaped, control
// characters escaped, invalid UTF-8 as U+FFFD (as encoding/json writes it);
// everything else as it is.
func appendQuoted(b []byte, s []byte) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

package mcpbridge

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An answer marshals to what the SDK marshals of the same result: the text
// (escaped: quotes, backslashes, control characters, invalid UTF-8 as
// U+FFFD; other characters as they are) and the structuredContent from the
// one copy of the JSON, the other members (_meta, isError) as the SDK
// writes them, in a buffer of exactly its size; AnswerSize is that size,
// but for the members the SDK adds.
func TestAnswerMarshalsAsTheSDK(t *testing.T) {
	for _, tc := range []struct {
		js         string
		structured bool
	}{
		{`{"customerId":"c","chargedCents":500}`, true},
		{`{"note":"a \"quote\", a back\\slash, a tab\t, <html> & é, \u2028"}`, true},
		{"control \x01\x1f and invalid \xff\xfe bytes", false},
		{`"a string result"`, false},
		{`[1,2,3]`, false},
		{``, false},
	} {
		js := []byte(tc.js)
		res := textResult(js, tc.structured)
		res.SetMeta(mcp.Meta{MetaReplayed: true, "io.modelcontextprotocol/serverInfo": map[string]any{"name": "bridge"}})
		a := asAnswer(res)
		if a == nil || a.structured != tc.structured {
			t.Fatalf("%q: asAnswer = %+v, want an answer", tc.js, a)
		}
		got, err := a.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("%q: the answer is not JSON: %v\n%s", tc.js, err, got)
		}
		if err := json.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%q: the answer is\n%s\nthe SDK's\n%s", tc.js, got, want)
		}
		if cap(got) != len(got) {
			t.Errorf("%q: %d bytes in a buffer of %d, want one of its size", tc.js, len(got), cap(got))
		}
		if extra := len(got) - int(a.AnswerSize()); extra < 0 || extra > 200 {
			t.Errorf("%q: AnswerSize %d of %d bytes", tc.js, a.AnswerSize(), len(got))
		}
	}
}

// Any result but textResult's (an error result, content of another kind,
// a structuredContent that is not the text) is marshalled by the SDK.
func TestOnlyTextResultsAreAnswers(t *testing.T) {
	js := []byte(`{"a":1}`)
	errResult := textResult(js, true)
	errResult.IsError = true
	other := textResult(js, false)
	other.StructuredContent = json.RawMessage(`{"a":1}`)
	for _, res := range []mcp.Result{
		errResult,
		other,
		&mcp.CallToolResult{Content: []mcp.Content{&mcp.ImageContent{Data: []byte{1}, MIMEType: "image/png"}}},
		&mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "a"}, &mcp.TextContent{Text: "b"}}},
		&mcp.ListToolsResult{},
	} {
		if a := asAnswer(res); a != nil {
			t.Errorf("%+v: an answer, want it left to the SDK", res)
		}
	}
}

// compactInPlace removes what json.Compact removes, outside strings only.
func TestCompactInPlace(t *testing.T) {
	in := "{ \"a b\" : [ 1 ,\n\t2 ] , \"c\\\" d\" :\r\"e \\\\\" }"
	want := `{"a b":[1,2],"c\" d":"e \\"}`
	if got := string(compactInPlace([]byte(in))); got != want {
		t.Errorf("compactInPlace(%q) = %q, want %q", in, got, want)
	}
	if got := string(compactInPlace([]byte(strings.Repeat(" ", 3)))); got != "" {
		t.Errorf("spaces: %q", got)
	}
}

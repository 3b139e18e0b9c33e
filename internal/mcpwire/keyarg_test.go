package mcpwire

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/idemgate/idemgate/internal/grpcerr"
)

func TestWithKeyArgument(t *testing.T) {
	typed, err := jsonschema.For[struct {
		Customer string `json:"customer"`
	}](nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, schema := range []any{typed, json.RawMessage(`{"type":"object","properties":{"customer":{"type":"string"}},"required":["customer"]}`), map[string]any{"type": "object"}} {
		s, err := WithKeyArgument(schema, "idempotency_key")
		if err != nil {
			t.Fatalf("%T: %v", schema, err)
		}
		props := s["properties"].(map[string]any)
		if p, _ := props["idempotency_key"].(map[string]any); p[SchemaKeyMark] != true || p["x-mcp-header"] != KeyHeaderName {
			t.Errorf("%T: key argument %v", schema, props["idempotency_key"])
		}
		req, _ := json.Marshal(s["required"])
		if !strings.Contains(string(req), `"idempotency_key"`) {
			t.Errorf("%T: required %s", schema, req)
		}
		// The key rules, as the schema states them.
		resolved, err := schemaFor(t, s).Resolve(nil)
		if err != nil {
			t.Fatal(err)
		}
		for key, valid := range map[string]bool{"order-1": true, "a b": true, " a": false, "a ": false, "": false, "k\u00e9": false, strings.Repeat("k", 256): false} {
			args := map[string]any{"idempotency_key": key}
			if _, ok := schema.(map[string]any); !ok {
				args["customer"] = "c"
			}
			if err := resolved.Validate(args); (err == nil) != valid {
				t.Errorf("%T: key %q: validation error %v, want valid=%v", schema, key, err, valid)
			}
		}
	}
	if typed.Properties["idempotency_key"] != nil {
		t.Error("WithKeyArgument changed the schema it was given")
	}
	for schema, want := range map[string]string{
		`{"type":"object","properties":{"idempotency_key":{}}}`:                                   "already has a property",
		`{"type":"object","properties":{"x":{"type":"string","x-mcp-header":"idempotency-key"}}}`: "already mirrored",
		`{"type":"string"}`: "not object",
		`[1]`:               "not a JSON object",
	} {
		if _, err := WithKeyArgument(json.RawMessage(schema), "idempotency_key"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", schema, err, want)
		}
	}
}

func schemaFor(t *testing.T, m map[string]any) *jsonschema.Schema {
	t.Helper()
	b, _ := json.Marshal(m)
	var s jsonschema.Schema
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func TestTakeArgument(t *testing.T) {
	for _, c := range []struct {
		args, key, rest, reason string
		ok                      bool
	}{
		{`{"a":1,"k":"x"}`, "x", `{"a":1}`, "", true},
		{`{"a":1}`, "", `{"a":1}`, "", false},
		{`{"a":1,"k":null}`, "", `{"a":1}`, "", false},
		{`{"a":1,"k":""}`, "", `{"a":1}`, "", false},
		{``, "", ``, "", false},
		{`{"k":5}`, "", ``, "IDEMPOTENCY_KEY_INVALID", false},
		{`[1]`, "", ``, ReasonArgumentsInvalid, false},
	} {
		key, ok, rest, err := TakeArgument(json.RawMessage(c.args), "k")
		if grpcerr.Reason(err) != c.reason || (c.reason == "" && err != nil) {
			t.Errorf("%s: error %v, want reason %q", c.args, err, c.reason)
			continue
		}
		if err == nil && (key != c.key || ok != c.ok || string(rest) != c.rest) {
			t.Errorf("%s: %q %v %s, want %q %v %s", c.args, key, ok, rest, c.key, c.ok, c.rest)
		}
	}
}

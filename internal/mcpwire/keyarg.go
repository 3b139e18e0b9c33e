package mcpwire

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// An added key argument is the carrier for hosts that send nothing but the
// arguments the model writes (a stock desktop or IDE host starting a server
// over stdio never sets _meta): the tool's listed input schema gains a
// required string property the model fills, and the gate takes it out of
// the arguments before the tool runs, so the tool never sees it.
const (
	// DefaultKeyArgument is the name an added key argument gets when none is
	// chosen: "idempotency_key".
	DefaultKeyArgument = "idempotency_key"
	// SchemaKeyMark marks, in a tool's input schema, the property that
	// carries the idempotency key: "io.idemgate/idempotency-key": true.
	SchemaKeyMark = "io.idemgate/idempotency-key"
	// KeyArgumentDescription is what the model reads of an added key
	// argument: one fresh value per intended action, reused only to retry
	// it. It never suggests an existing id (a customer's, an order's): a
	// model that reused one for a second real action would be replayed the
	// first action's result, and the second action silently not taken.
	KeyArgumentDescription = "Idempotency key of this action: a fresh unique value (a new UUID) for each action you intend to take, " +
		"reused only to retry that same action after an error, a timeout or a lost answer: the retry then gets the first attempt's result " +
		"and the action runs once. Never reuse an id of something else (a customer, an account, an earlier order) as the key: " +
		"a second, different action sent with a used key does not run, and gets the first action's result. 1 to 255 printable ASCII characters."
)

// keyArgumentName is what an added key argument may be called: a plain
// identifier, so no host or schema tool mangles it.
var keyArgumentName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,63}$`)

// CheckKeyArgumentName refuses a name an added key argument cannot have:
// 1 to 64 characters, a letter or "_" then letters, digits, "_", "." or "-".
func CheckKeyArgumentName(name string) error {
	if !keyArgumentName.MatchString(name) {
		return fmt.Errorf("key argument name %q must be 1 to 64 characters: a letter or _ then letters, digits, _, . or -", name)
	}
	return nil
}

// KeyArgumentSchema is the JSON Schema of an added key argument: a string
// the idemgate key rules accept, marked as the key (SchemaKeyMark) and as
// the x-mcp-header KeyHeaderName (clients over streamable HTTP at 2026-07-28
// mirror it into Mcp-Param-Idempotency-Key), described for the model.
func KeyArgumentSchema() map[string]any {
	return map[string]any{
		"type":         "string",
		"minLength":    1,
		"maxLength":    255,
		"pattern":      `^[!-~]([ -~]*[!-~])?$`,
		"description":  KeyArgumentDescription,
		SchemaKeyMark:  true,
		"x-mcp-header": KeyHeaderName,
	}
}

// WithKeyArgument returns a copy of a tool's input schema (any JSON object
// schema: a *jsonschema.Schema, a map, raw JSON) with a required top-level
// property name added (KeyArgumentSchema). It fails when the schema is not
// an object schema, already has a property of that name, or already
// mirrors another property as KeyHeaderName.
func WithKeyArgument(schema any, name string) (map[string]any, error) {
	if err := CheckKeyArgumentName(name); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(schema)
	if err != nil {
		return nil, fmt.Errorf("the input schema does not encode: %w", err)
	}
	var s map[string]any
	if err := json.Unmarshal(raw, &s); err != nil || s == nil {
		return nil, fmt.Errorf("the input schema is not a JSON object")
	}
	if t, ok := s["type"]; ok && t != "object" {
		return nil, fmt.Errorf("the input schema's type is %v, not object", t)
	}
	props, _ := s["properties"].(map[string]any)
	if props == nil {
		props = map[string]any{}
	}
	if _, taken := props[name]; taken {
		return nil, fmt.Errorf("the input schema already has a property %q: choose another key argument name", name)
	}
	for other, p := range props {
		if m, ok := p.(map[string]any); ok {
			if h, _ := m["x-mcp-header"].(string); equalFold(h, KeyHeaderName) {
				return nil, fmt.Errorf("the property %q is already mirrored as the header %s", other, KeyHeaderName)
			}
		}
	}
	props[name] = KeyArgumentSchema()
	s["properties"] = props
	s["type"] = "object"
	required, _ := s["required"].([]any)
	s["required"] = append(required, name)
	return s, nil
}

// CallKeyCarriers names, for a refusal, the carriers CallKey reads: the
// key of a tools/call outside its arguments.
const CallKeyCarriers = `_meta["` + MetaKey + `"] or the idempotencyKey parameter`

// HeaderValue decodes a Mcp-Param- header value as SEP-2243 writes it
// (a value that cannot travel as plain ASCII is sent "=?base64?...?="),
// and reports false for an absent header; a wrapped value that does not
// decode is returned as sent, so it matches no argument but itself.
func HeaderValue(h string) (string, bool) {
	if h == "" {
		return "", false
	}
	if inner, ok := strings.CutPrefix(h, "=?base64?"); ok {
		if inner, ok = strings.CutSuffix(inner, "?="); ok {
			if b, err := base64.StdEncoding.DecodeString(inner); err == nil {
				return string(b), true
			}
		}
	}
	return h, true
}

func equalFold(a, b string) bool { return bytes.EqualFold([]byte(a), []byte(b)) }

// TakeArgument splits the call's arguments (a JSON object, or nothing) into
// the value of the top-level member name and the rest, which is what the
// tool gets. The rest keeps every other member's bytes; members come out
// in sorted order. A missing member, or a null or "" one, is no key. A
// member that is not a string is IDEMPOTENCY_KEY_INVALID; arguments that
// are not an object are MCP_ARGUMENTS_INVALID.
func TakeArgument(args json.RawMessage, name string) (key string, ok bool, rest json.RawMessage, err error) {
	trimmed := bytes.TrimSpace(args)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return "", false, args, nil
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &members); err != nil || members == nil {
		return "", false, nil, grpcerr.New(codes.InvalidArgument, ReasonArgumentsInvalid, "the arguments are not a JSON object", nil, 0)
	}
	v, present := members[name]
	if !present {
		return "", false, args, nil
	}
	delete(members, name)
	if rest, err = json.Marshal(members); err != nil {
		return "", false, nil, err
	}
	v = bytes.TrimSpace(v)
	if bytes.Equal(v, []byte("null")) {
		return "", false, rest, nil
	}
	if json.Unmarshal(v, &key) != nil {
		return "", false, nil, grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyInvalid,
			"the key argument "+name+" must be a string", map[string]string{"field": name}, 0)
	}
	return key, key != "", rest, nil
}

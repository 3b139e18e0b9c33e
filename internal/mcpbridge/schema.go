package mcpbridge

import (
	"math"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// Schema returns the JSON Schema (draft 2020-12, as a JSON object) of the
// protojson form of md, as the bridge reads a tool's arguments: properties by
// their JSON names; bools as booleans; strings as strings; bytes as base64
// strings; 32-bit integers as integers; 64-bit integers as an integer or a
// decimal string (protojson reads either, exactly, above 2^53 too); floats as
// numbers; enums as strings naming their values; repeated fields as arrays;
// maps as objects; nested messages by $ref into $defs (so recursive messages
// stay finite); well-known types in their protojson form (Timestamp an RFC
// 3339 string, Duration "1.5s", FieldMask a string, Struct an object, Value
// anything, wrappers their value); a singular message field outside a oneof
// may also be null (protojson writes an unset one so when emitting
// unpopulated fields, as the bridge's results do, and reads null as unset).
// A field is required only when the schema says so (proto2 required,
// editions LEGACY_REQUIRED): proto3 fields are all optional. Unknown
// properties are refused (additionalProperties false), as protojson refuses
// them. Oneofs are not expressed: setting two members of one is refused by
// the bridge when it parses the arguments.
func Schema(md protoreflect.MessageDescriptor) map[string]any {
	return (&schemaGen{defs: map[string]any{}}).root(md)
}

// OutputSchema returns the JSON Schema of md as the bridge writes a result
// of it: Schema's, except that a 64-bit integer (int64, uint64, sint64,
// fixed64, sfixed64, and inside Int64Value and UInt64Value) is an integer,
// not below 0 when unsigned, since the bridge writes them as JSON numbers
// rather than protojson's strings. The JSON text carries the exact decimal
// digits, above 2^53 too; a client that parses numbers as IEEE doubles
// (JavaScript's JSON.parse, and so most JavaScript clients) rounds those
// above 2^53 (9007199254740992), one that parses them exactly (Python, Go
// with json.Decoder.UseNumber) does not. The schema sets no maximum: the
// largest 64-bit integers are not doubles, and a validator comparing an
// exact value with a rounded bound would refuse them.
func OutputSchema(md protoreflect.MessageDescriptor) map[string]any {
	return (&schemaGen{defs: map[string]any{}, output: true}).root(md)
}

type schemaGen struct {
	defs map[string]any
	// output is set for a result's schema, whose 64-bit integers are
	// numbers (resultJSON), unset for the arguments'.
	output bool
}

// root is the schema of md with the definitions it refers to.
func (g *schemaGen) root(md protoreflect.MessageDescriptor) map[string]any {
	s := g.object(md)
	if len(g.defs) > 0 {
		s["$defs"] = g.defs
	}
	return s
}

// object is the schema of a message as an object, with its fields.
func (g *schemaGen) object(md protoreflect.MessageDescriptor) map[string]any {
	props := map[string]any{}
	var required []string
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		props[fd.JSONName()] = g.field(fd)
		if fd.Cardinality() == protoreflect.Required {
			required = append(required, fd.JSONName())
		}
	}
	s := map[string]any{
		"type":                 "object",
		"properties":           props,
		"additionalProperties": false,
	}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

func (g *schemaGen) field(fd protoreflect.FieldDescriptor) map[string]any {
	var s map[string]any
	switch {
	case fd.IsMap():
		s = map[string]any{
			"type":                 "object",
			"additionalProperties": g.singular(fd.MapValue()),
		}
		if k := fd.MapKey().Kind(); k != protoreflect.StringKind {
			s["propertyNames"] = map[string]any{"pattern": mapKeyPattern(k)}
		}
	case fd.IsList():
		s = map[string]any{"type": "array", "items": g.singular(fd)}
	default:
		s = g.singular(fd)
		if nullable(fd) {
			// protojson writes an unset message field as null when it
			// emits unpopulated fields, as the bridge's results do, and
			// reads null as unset.
			s = map[string]any{"anyOf": []any{s, map[string]any{"type": "null"}}}
		}
	}
	if d := comment(fd); d != "" {
		s["description"] = d
	}
	return s
}

// nullable reports whether protojson writes fd as null when unset and
// emitting unpopulated fields: a singular message field outside a oneof
// (unset oneof members are left out), except google.protobuf.Value, whose
// schema is anything already.
func nullable(fd protoreflect.FieldDescriptor) bool {
	if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
		return false
	}
	return fd.ContainingOneof() == nil && fd.Message().FullName() != "google.protobuf.Value"
}

// singular is the schema of one value of fd's kind.
func (g *schemaGen) singular(fd protoreflect.FieldDescriptor) map[string]any {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return map[string]any{"type": "boolean"}
	case protoreflect.StringKind:
		return map[string]any{"type": "string"}
	case protoreflect.BytesKind:
		return map[string]any{"type": "string", "contentEncoding": "base64"}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return map[string]any{"type": "integer", "minimum": math.MinInt32, "maximum": math.MaxInt32}
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return map[string]any{"type": "integer", "minimum": 0, "maximum": math.MaxUint32}
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return int64Schema(true, g.output)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return int64Schema(false, g.output)
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return floatSchema()
	case protoreflect.EnumKind:
		return enumSchema(fd.Enum())
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return g.message(fd.Message())
	}
	return map[string]any{}
}

// message is the schema of a message-typed value: a well-known type's
// protojson form, or a $ref to the message's definition.
func (g *schemaGen) message(md protoreflect.MessageDescriptor) map[string]any {
	if s, ok := wellKnown(md, g.output); ok {
		return s
	}
	name := string(md.FullName())
	if _, ok := g.defs[name]; !ok {
		g.defs[name] = map[string]any{} // placeholder: a recursive reference stops here
		def := g.object(md)
		if d := comment(md); d != "" {
			def["description"] = d
		}
		g.defs[name] = def
	}
	return map[string]any{"$ref": "#/$defs/" + name}
}

// int64Schema is the schema of a 64-bit integer: in a result an integer
// (resultJSON writes a JSON number), in arguments an integer or a decimal
// string, as protojson reads either.
func int64Schema(signed, output bool) map[string]any {
	if output {
		if signed {
			return map[string]any{"type": "integer"}
		}
		return map[string]any{"type": "integer", "minimum": 0}
	}
	pattern := "^[0-9]+$"
	if signed {
		pattern = "^-?[0-9]+$"
	}
	return map[string]any{"anyOf": []any{
		map[string]any{"type": "integer"},
		map[string]any{"type": "string", "pattern": pattern},
	}}
}

func floatSchema() map[string]any {
	return map[string]any{"anyOf": []any{
		map[string]any{"type": "number"},
		map[string]any{"type": "string", "enum": []any{"NaN", "Infinity", "-Infinity"}},
	}}
}

func enumSchema(ed protoreflect.EnumDescriptor) map[string]any {
	values := ed.Values()
	names := make([]any, 0, values.Len())
	for i := 0; i < values.Len(); i++ {
		names = append(names, string(values.Get(i).Name()))
	}
	if ed.FullName() == "google.protobuf.NullValue" {
		return map[string]any{"type": "null"}
	}
	return map[string]any{"type": "string", "enum": names}
}

func mapKeyPattern(k protoreflect.Kind) string {
	switch k {
	case protoreflect.BoolKind:
		return "^(true|false)$"
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return "^[0-9]+$"
	}
	return "^-?[0-9]+$"
}

// wellKnown is the protojson form of a well-known type, if md is one; output
// as for int64Schema.
func wellKnown(md protoreflect.MessageDescriptor, output bool) (map[string]any, bool) {
	switch md.FullName() {
	case "google.protobuf.Timestamp":
		return map[string]any{"type": "string", "format": "date-time"}, true
	case "google.protobuf.Duration":
		return map[string]any{"type": "string", "pattern": `^-?[0-9]+(\.[0-9]{1,9})?s$`}, true
	case "google.protobuf.FieldMask":
		return map[string]any{"type": "string"}, true
	case "google.protobuf.Struct":
		return map[string]any{"type": "object"}, true
	case "google.protobuf.ListValue":
		return map[string]any{"type": "array"}, true
	case "google.protobuf.Value":
		return map[string]any{}, true
	case "google.protobuf.Empty":
		return map[string]any{"type": "object", "additionalProperties": false}, true
	case "google.protobuf.Any":
		return map[string]any{"type": "object", "properties": map[string]any{"@type": map[string]any{"type": "string"}}, "required": []string{"@type"}}, true
	case "google.protobuf.BoolValue":
		return map[string]any{"type": "boolean"}, true
	case "google.protobuf.StringValue":
		return map[string]any{"type": "string"}, true
	case "google.protobuf.BytesValue":
		return map[string]any{"type": "string", "contentEncoding": "base64"}, true
	case "google.protobuf.Int32Value":
		return map[string]any{"type": "integer", "minimum": math.MinInt32, "maximum": math.MaxInt32}, true
	case "google.protobuf.UInt32Value":
		return map[string]any{"type": "integer", "minimum": 0, "maximum": math.MaxUint32}, true
	case "google.protobuf.Int64Value":
		return int64Schema(true, output), true
	case "google.protobuf.UInt64Value":
		return int64Schema(false, output), true
	case "google.protobuf.FloatValue", "google.protobuf.DoubleValue":
		return floatSchema(), true
	}
	return nil, false
}

// objectJSON reports whether md's protojson form is a JSON object, the only
// form MCP's structuredContent and outputSchema allow.
func objectJSON(md protoreflect.MessageDescriptor) bool {
	s, ok := wellKnown(md, true)
	return !ok || s["type"] == "object"
}

// comment is the leading comment of a descriptor, when its file carries
// source info (buf build and protoc --include_source_info keep it; the
// descriptors linked into Go binaries and most reflection services do not).
func comment(d protoreflect.Descriptor) string {
	loc := d.ParentFile().SourceLocations().ByDescriptor(d)
	return strings.TrimSpace(loc.LeadingComments)
}

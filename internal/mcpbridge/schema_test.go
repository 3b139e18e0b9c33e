package mcpbridge

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	_ "google.golang.org/protobuf/types/known/durationpb"
	_ "google.golang.org/protobuf/types/known/structpb"
	_ "google.golang.org/protobuf/types/known/timestamppb"
	_ "google.golang.org/protobuf/types/known/wrapperspb"
)

// kitchen is a file with one field of every shape the schema handles.
const kitchen = `
name: "kitchen.proto" package: "k" syntax: "proto3"
dependency: "google/protobuf/timestamp.proto"
dependency: "google/protobuf/duration.proto"
dependency: "google/protobuf/struct.proto"
dependency: "google/protobuf/wrappers.proto"
message_type {
  name: "Req"
  field { name: "flag" number: 1 type: TYPE_BOOL label: LABEL_OPTIONAL json_name: "flag" }
  field { name: "small" number: 2 type: TYPE_INT32 label: LABEL_OPTIONAL json_name: "small" }
  field { name: "big" number: 3 type: TYPE_UINT64 label: LABEL_OPTIONAL json_name: "big" }
  field { name: "ratio" number: 4 type: TYPE_DOUBLE label: LABEL_OPTIONAL json_name: "ratio" }
  field { name: "blob" number: 5 type: TYPE_BYTES label: LABEL_OPTIONAL json_name: "blob" }
  field { name: "color" number: 6 type: TYPE_ENUM type_name: ".k.Color" label: LABEL_OPTIONAL json_name: "color" }
  field { name: "tags" number: 7 type: TYPE_STRING label: LABEL_REPEATED json_name: "tags" }
  field { name: "counts" number: 8 type: TYPE_MESSAGE type_name: ".k.Req.CountsEntry" label: LABEL_REPEATED json_name: "counts" }
  field { name: "child" number: 9 type: TYPE_MESSAGE type_name: ".k.Node" label: LABEL_OPTIONAL json_name: "child" }
  field { name: "at" number: 10 type: TYPE_MESSAGE type_name: ".google.protobuf.Timestamp" label: LABEL_OPTIONAL json_name: "at" }
  field { name: "wait" number: 11 type: TYPE_MESSAGE type_name: ".google.protobuf.Duration" label: LABEL_OPTIONAL json_name: "wait" }
  field { name: "extra" number: 12 type: TYPE_MESSAGE type_name: ".google.protobuf.Struct" label: LABEL_OPTIONAL json_name: "extra" }
  field { name: "maybe" number: 13 type: TYPE_MESSAGE type_name: ".google.protobuf.Int64Value" label: LABEL_OPTIONAL json_name: "maybe" }
  field { name: "snake_case" number: 14 type: TYPE_STRING label: LABEL_OPTIONAL json_name: "snakeCase" }
  nested_type {
    name: "CountsEntry" options { map_entry: true }
    field { name: "key" number: 1 type: TYPE_INT32 label: LABEL_OPTIONAL json_name: "key" }
    field { name: "value" number: 2 type: TYPE_INT64 label: LABEL_OPTIONAL json_name: "value" }
  }
}
message_type {
  name: "Node"
  field { name: "name" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL json_name: "name" }
  field { name: "children" number: 2 type: TYPE_MESSAGE type_name: ".k.Node" label: LABEL_REPEATED json_name: "children" }
}
enum_type { name: "Color" value { name: "COLOR_UNSPECIFIED" number: 0 } value { name: "COLOR_RED" number: 1 } }
`

func kitchenMessage(t *testing.T, name protoreflect.FullName) protoreflect.MessageDescriptor {
	t.Helper()
	var fdp descriptorpb.FileDescriptorProto
	if err := prototext.Unmarshal([]byte(kitchen), &fdp); err != nil {
		t.Fatal(err)
	}
	fd, err := protodesc.NewFile(&fdp, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	return fd.Messages().ByName(name.Name())
}

func TestSchemaFollowsProtoJSON(t *testing.T) {
	got := Schema(kitchenMessage(t, "k.Req"))
	int64s := func(pattern string) map[string]any {
		return map[string]any{"anyOf": []any{
			map[string]any{"type": "integer"},
			map[string]any{"type": "string", "pattern": pattern},
		}}
	}
	orNull := func(s map[string]any) map[string]any {
		return map[string]any{"anyOf": []any{s, map[string]any{"type": "null"}}}
	}
	want := map[string]any{
		"type":                 "object",
		"additionalProperties": false,
		"properties": map[string]any{
			"flag":  map[string]any{"type": "boolean"},
			"small": map[string]any{"type": "integer", "minimum": float64(-2147483648), "maximum": float64(2147483647)},
			"big":   int64s("^[0-9]+$"),
			"ratio": map[string]any{"anyOf": []any{
				map[string]any{"type": "number"},
				map[string]any{"type": "string", "enum": []any{"NaN", "Infinity", "-Infinity"}},
			}},
			"blob":  map[string]any{"type": "string", "contentEncoding": "base64"},
			"color": map[string]any{"type": "string", "enum": []any{"COLOR_UNSPECIFIED", "COLOR_RED"}},
			"tags":  map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
			"counts": map[string]any{
				"type":                 "object",
				"additionalProperties": int64s("^-?[0-9]+$"),
				"propertyNames":        map[string]any{"pattern": "^-?[0-9]+$"},
			},
			"child":     orNull(map[string]any{"$ref": "#/$defs/k.Node"}),
			"at":        orNull(map[string]any{"type": "string", "format": "date-time"}),
			"wait":      orNull(map[string]any{"type": "string", "pattern": `^-?[0-9]+(\.[0-9]{1,9})?s$`}),
			"extra":     orNull(map[string]any{"type": "object"}),
			"maybe":     orNull(int64s("^-?[0-9]+$")),
			"snakeCase": map[string]any{"type": "string"},
		},
		"$defs": map[string]any{
			"k.Node": map[string]any{
				"type":                 "object",
				"additionalProperties": false,
				"properties": map[string]any{
					"name":     map[string]any{"type": "string"},
					"children": map[string]any{"type": "array", "items": map[string]any{"$ref": "#/$defs/k.Node"}},
				},
			},
		},
	}
	if g := normalize(t, got); !reflect.DeepEqual(g, normalize(t, want)) {
		b, _ := json.MarshalIndent(g, "", "  ")
		t.Errorf("schema:\n%s", b)
	}
}

// A proto2 required field is required in the schema; nothing else is.
func TestSchemaRequiredFromPresence(t *testing.T) {
	md := (&descriptorpb.UninterpretedOption_NamePart{}).ProtoReflect().Descriptor()
	got := Schema(md)
	req, _ := got["required"].([]string)
	if !reflect.DeepEqual(req, []string{"namePart", "isExtension"}) {
		t.Errorf("required = %v, want namePart, isExtension", got["required"])
	}
	if _, ok := Schema(kitchenMessage(t, "k.Req"))["required"]; ok {
		t.Error("a proto3 message has required fields")
	}
}

func normalize(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// What the bridge writes of a response conforms to the output schema it
// advertises for it: every field emitted, an unset message field as null,
// 64-bit integers as numbers.
func TestResultJSONConformsToTheSchema(t *testing.T) {
	md := kitchenMessage(t, "k.Req")
	child := dynamicpb.NewMessage(md.Fields().ByName("child").Message())
	child.Set(child.Descriptor().Fields().ByName("name"), protoreflect.ValueOfString("n"))
	withChild := dynamicpb.NewMessage(md)
	withChild.Set(md.Fields().ByName("child"), protoreflect.ValueOfMessage(child))
	with64 := dynamicpb.NewMessage(md)
	if err := (protojson.UnmarshalOptions{}).Unmarshal([]byte(`{"big":"18446744073709551615","counts":{"-1":"-9223372036854775808"},"maybe":"9223372036854775807"}`), with64); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(OutputSchema(md))
	if err != nil {
		t.Fatal(err)
	}
	var schema jsonschema.Schema
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	resolved, err := schema.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]*dynamicpb.Message{"empty": dynamicpb.NewMessage(md), "with a child": withChild, "with 64-bit integers": with64} {
		js, err := resultJSON(protoregistry.GlobalTypes, m)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		if err := json.Unmarshal(js, &got); err != nil {
			t.Fatal(err)
		}
		if len(got) != md.Fields().Len() {
			t.Errorf("%s: %s has %d fields, want all %d", name, js, len(got), md.Fields().Len())
		}
		if err := resolved.Validate(got); err != nil {
			t.Errorf("%s: %s does not conform to the schema: %v", name, js, err)
		}
	}
}

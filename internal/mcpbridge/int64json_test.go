package mcpbridge

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	_ "google.golang.org/protobuf/types/known/anypb"
	_ "google.golang.org/protobuf/types/known/fieldmaskpb"

	_ "github.com/idemgate/idemgate/gen/examples/payments/v1"
)

// nums has a 64-bit integer in every position a result can hold one, next
// to the well-known types whose protojson form the bridge leaves alone, and
// a proto2 message with 64-bit extensions.
const nums = `
file {
  name: "nums.proto" package: "n" syntax: "proto3"
  dependency: "google/protobuf/timestamp.proto"
  dependency: "google/protobuf/duration.proto"
  dependency: "google/protobuf/struct.proto"
  dependency: "google/protobuf/wrappers.proto"
  dependency: "google/protobuf/any.proto"
  dependency: "google/protobuf/field_mask.proto"
  message_type {
    name: "Nums"
    field { name: "i64" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL json_name: "i64" }
    field { name: "u64" number: 2 type: TYPE_UINT64 label: LABEL_OPTIONAL json_name: "u64" }
    field { name: "s64" number: 3 type: TYPE_SINT64 label: LABEL_OPTIONAL json_name: "s64" }
    field { name: "f64" number: 4 type: TYPE_FIXED64 label: LABEL_OPTIONAL json_name: "f64" }
    field { name: "sf64" number: 5 type: TYPE_SFIXED64 label: LABEL_OPTIONAL json_name: "sf64" }
    field { name: "list" number: 6 type: TYPE_INT64 label: LABEL_REPEATED json_name: "list" }
    field { name: "by_name" number: 7 type: TYPE_MESSAGE type_name: ".n.Nums.ByNameEntry" label: LABEL_REPEATED json_name: "byName" }
    field { name: "by_id" number: 8 type: TYPE_MESSAGE type_name: ".n.Nums.ByIdEntry" label: LABEL_REPEATED json_name: "byId" }
    field { name: "child" number: 9 type: TYPE_MESSAGE type_name: ".n.Leaf" label: LABEL_OPTIONAL json_name: "child" }
    field { name: "children" number: 10 type: TYPE_MESSAGE type_name: ".n.Leaf" label: LABEL_REPEATED json_name: "children" }
    field { name: "kids" number: 11 type: TYPE_MESSAGE type_name: ".n.Nums.KidsEntry" label: LABEL_REPEATED json_name: "kids" }
    field { name: "pick" number: 12 type: TYPE_INT64 label: LABEL_OPTIONAL oneof_index: 0 json_name: "pick" }
    field { name: "other" number: 13 type: TYPE_STRING label: LABEL_OPTIONAL oneof_index: 0 json_name: "other" }
    field { name: "w64" number: 14 type: TYPE_MESSAGE type_name: ".google.protobuf.Int64Value" label: LABEL_OPTIONAL json_name: "w64" }
    field { name: "wu64" number: 15 type: TYPE_MESSAGE type_name: ".google.protobuf.UInt64Value" label: LABEL_OPTIONAL json_name: "wu64" }
    field { name: "ws" number: 16 type: TYPE_MESSAGE type_name: ".google.protobuf.Int64Value" label: LABEL_REPEATED json_name: "ws" }
    field { name: "at" number: 17 type: TYPE_MESSAGE type_name: ".google.protobuf.Timestamp" label: LABEL_OPTIONAL json_name: "at" }
    field { name: "wait" number: 18 type: TYPE_MESSAGE type_name: ".google.protobuf.Duration" label: LABEL_OPTIONAL json_name: "wait" }
    field { name: "extra" number: 19 type: TYPE_MESSAGE type_name: ".google.protobuf.Struct" label: LABEL_OPTIONAL json_name: "extra" }
    field { name: "mask" number: 20 type: TYPE_MESSAGE type_name: ".google.protobuf.FieldMask" label: LABEL_OPTIONAL json_name: "mask" }
    field { name: "anys" number: 21 type: TYPE_MESSAGE type_name: ".google.protobuf.Any" label: LABEL_REPEATED json_name: "anys" }
    field { name: "text" number: 22 type: TYPE_STRING label: LABEL_OPTIONAL json_name: "text" }
    field { name: "small" number: 23 type: TYPE_INT32 label: LABEL_OPTIONAL json_name: "small" }
    field { name: "ratio" number: 24 type: TYPE_DOUBLE label: LABEL_OPTIONAL json_name: "ratio" }
    oneof_decl { name: "choice" }
    nested_type {
      name: "ByNameEntry" options { map_entry: true }
      field { name: "key" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL json_name: "key" }
      field { name: "value" number: 2 type: TYPE_INT64 label: LABEL_OPTIONAL json_name: "value" }
    }
    nested_type {
      name: "ByIdEntry" options { map_entry: true }
      field { name: "key" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL json_name: "key" }
      field { name: "value" number: 2 type: TYPE_UINT64 label: LABEL_OPTIONAL json_name: "value" }
    }
    nested_type {
      name: "KidsEntry" options { map_entry: true }
      field { name: "key" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL json_name: "key" }
      field { name: "value" number: 2 type: TYPE_MESSAGE type_name: ".n.Leaf" label: LABEL_OPTIONAL json_name: "value" }
    }
  }
  message_type {
    name: "Leaf"
    field { name: "v" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL json_name: "v" }
    field { name: "vs" number: 2 type: TYPE_SINT64 label: LABEL_REPEATED json_name: "vs" }
    field { name: "next" number: 3 type: TYPE_MESSAGE type_name: ".n.Leaf" label: LABEL_OPTIONAL json_name: "next" }
  }
}
file {
  name: "ext.proto" package: "x" syntax: "proto2"
  message_type {
    name: "Base"
    field { name: "a" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL json_name: "a" }
    extension_range { start: 100 end: 200 }
  }
  extension { name: "big" number: 100 type: TYPE_INT64 label: LABEL_OPTIONAL extendee: ".x.Base" json_name: "big" }
  extension { name: "bigs" number: 101 type: TYPE_FIXED64 label: LABEL_REPEATED extendee: ".x.Base" json_name: "bigs" }
}
`

// numsTypes is nums's files with the well-known types they import, and
// their types, as the bridge's dynamicpb.Types are its tool server's.
func numsTypes(t *testing.T) (*protoregistry.Files, *dynamicpb.Types) {
	t.Helper()
	var set descriptorpb.FileDescriptorSet
	if err := prototext.Unmarshal([]byte(nums), &set); err != nil {
		t.Fatal(err)
	}
	files := new(protoregistry.Files)
	for _, name := range []string{
		"google/protobuf/timestamp.proto", "google/protobuf/duration.proto", "google/protobuf/struct.proto",
		"google/protobuf/wrappers.proto", "google/protobuf/any.proto", "google/protobuf/field_mask.proto",
	} {
		fd, err := protoregistry.GlobalFiles.FindFileByPath(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := files.RegisterFile(fd); err != nil {
			t.Fatal(err)
		}
	}
	for _, fdp := range set.File {
		fd, err := protodesc.NewFile(fdp, files)
		if err != nil {
			t.Fatal(err)
		}
		if err := files.RegisterFile(fd); err != nil {
			t.Fatal(err)
		}
	}
	return files, dynamicpb.NewTypes(files)
}

func numsMessage(t *testing.T, types *dynamicpb.Types, name protoreflect.FullName, js string) *dynamicpb.Message {
	t.Helper()
	mt, err := types.FindMessageByName(name)
	if err != nil {
		t.Fatal(err)
	}
	m := mt.New().Interface().(*dynamicpb.Message)
	if err := (protojson.UnmarshalOptions{Resolver: types}).Unmarshal([]byte(js), m); err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return m
}

// numsIn sets every field of a Nums, its 64-bit integers as strings (as
// protojson writes them, and as a caller may send them).
const numsIn = `{
  "i64": "9223372036854775807", "u64": "18446744073709551615", "s64": "-9223372036854775808",
  "sf64": "-1",
  "list": ["-9223372036854775808", "0", "9223372036854775807", "-5"],
  "byName": {"b": "-9007199254740993", "a": "1", "q\"uote": "2"},
  "byId": {"7": "0", "-9223372036854775808": "18446744073709551615"},
  "child": {"v": "9007199254740993", "next": {"v": "-2", "vs": ["1"]}},
  "children": [{}, {"v": "3", "vs": ["4", "-9223372036854775808"]}],
  "kids": {"x": {"v": "-6"}},
  "pick": "-42",
  "w64": "-9223372036854775808", "wu64": "18446744073709551615", "ws": ["0", "9223372036854775807"],
  "at": "2026-12-02T03:25:25.123456789Z", "wait": "-1.5s",
  "extra": {"s": "7", "n": 12, "l": [1, "2"]},
  "mask": "a.b,c",
  "anys": [
    {"@type": "type.googleapis.com/n.Leaf", "v": "9007199254740993", "vs": ["-1"]},
    {"@type": "type.googleapis.com/google.protobuf.Int64Value", "value": "-9223372036854775808"},
    {"@type": "type.googleapis.com/google.protobuf.UInt64Value", "value": "18446744073709551615"},
    {"@type": "type.googleapis.com/google.protobuf.Timestamp", "value": "2026-12-02T03:25:25Z"},
    {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": "5"},
    {"@type": "type.googleapis.com/n.Nums", "text": "8", "anys": [{"@type": "type.googleapis.com/n.Leaf", "v": "-3"}]}
  ],
  "text": "12\"3\\", "small": -7, "ratio": 1.5
}`

// numsOut is what the bridge writes of numsIn: protojson's members in
// protojson's order, every 64-bit integer a JSON number with its exact
// digits, map keys, strings and the other well-known types as protojson
// writes them (inside an Any too, where the embedded type decides).
const numsOut = `{"i64":9223372036854775807,"u64":18446744073709551615,"s64":-9223372036854775808,"f64":0,"sf64":-1,` +
	`"list":[-9223372036854775808,0,9223372036854775807,-5],` +
	`"byName":{"a":1,"b":-9007199254740993,"q\"uote":2},` +
	`"byId":{"-9223372036854775808":18446744073709551615,"7":0},` +
	`"child":{"v":9007199254740993,"vs":[],"next":{"v":-2,"vs":[1],"next":null}},` +
	`"children":[{"v":0,"vs":[],"next":null},{"v":3,"vs":[4,-9223372036854775808],"next":null}],` +
	`"kids":{"x":{"v":-6,"vs":[],"next":null}},` +
	`"pick":-42,` +
	`"w64":-9223372036854775808,"wu64":18446744073709551615,"ws":[0,9223372036854775807],` +
	`"at":"2026-12-02T03:25:25.123456789Z","wait":"-1.500s",` +
	`"extra":{"l":[1,"2"],"n":12,"s":"7"},` +
	`"mask":"a.b,c",` +
	`"anys":[` +
	`{"@type":"type.googleapis.com/n.Leaf","v":9007199254740993,"vs":[-1],"next":null},` +
	`{"@type":"type.googleapis.com/google.protobuf.Int64Value","value":-9223372036854775808},` +
	`{"@type":"type.googleapis.com/google.protobuf.UInt64Value","value":18446744073709551615},` +
	`{"@type":"type.googleapis.com/google.protobuf.Timestamp","value":"2026-12-02T03:25:25Z"},` +
	`{"@type":"type.googleapis.com/google.protobuf.StringValue","value":"5"},` +
	`{"@type":"type.googleapis.com/n.Nums","i64":0,"u64":0,"s64":0,"f64":0,"sf64":0,"list":[],"byName":{},"byId":{},` +
	`"child":null,"children":[],"kids":{},"w64":null,"wu64":null,"ws":[],"at":null,"wait":null,"extra":null,"mask":null,` +
	`"anys":[{"@type":"type.googleapis.com/n.Leaf","v":-3,"vs":[],"next":null}],"text":"8","small":0,"ratio":0}` +
	`],` +
	`"text":"12\"3\\","small":-7,"ratio":1.5}`

// A result writes every 64-bit integer as a JSON number with its exact
// digits, wherever it is, and nothing else differs from protojson's: the
// same members in the same order, map keys strings, the other well-known
// types as protojson writes them. The text is fixed (this test's constant),
// so it is the same on every call and in every process.
func TestResultJSONWritesInt64sAsNumbers(t *testing.T) {
	_, types := numsTypes(t)
	m := numsMessage(t, types, "n.Nums", numsIn)
	for i := range 2 {
		js, err := resultJSON(types, m)
		if err != nil {
			t.Fatal(err)
		}
		if string(js) != numsOut {
			t.Fatalf("call %d:\n got %s\nwant %s", i, js, numsOut)
		}
	}
	// Input takes numbers as well as strings, exactly, above 2^53 too: the
	// result parses back to the same message.
	back := numsMessage(t, types, "n.Nums", numsOut)
	if !proto.Equal(back, m) {
		t.Errorf("the result parsed back is\n%v\nwant\n%v", back, m)
	}
	// A client that decodes numbers exactly (Go with UseNumber, Python)
	// reads the exact integers.
	d := json.NewDecoder(strings.NewReader(numsOut))
	d.UseNumber()
	var got map[string]any
	if err := d.Decode(&got); err != nil {
		t.Fatal(err)
	}
	for field, want := range map[string]json.Number{"i64": "9223372036854775807", "u64": "18446744073709551615", "s64": "-9223372036854775808"} {
		if got[field] != want {
			t.Errorf("%s = %#v, want %s", field, got[field], want)
		}
	}
}

// An unset Nums: every 64-bit integer is 0, and an unset wrapper is null.
func TestResultJSONWritesZeroInt64sAsNumbers(t *testing.T) {
	_, types := numsTypes(t)
	js, err := resultJSON(types, numsMessage(t, types, "n.Nums", `{}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"i64":0,"u64":0,"s64":0,"f64":0,"sf64":0,"list":[],"byName":{},"byId":{},"child":null,"children":[],"kids":{},` +
		`"w64":null,"wu64":null,"ws":[],"at":null,"wait":null,"extra":null,"mask":null,"anys":[],"text":"","small":0,"ratio":0}`
	if string(js) != want {
		t.Errorf("\n got %s\nwant %s", js, want)
	}
}

// Extensions are named by their full name in brackets; their 64-bit
// integers are numbers too.
func TestResultJSONWritesInt64ExtensionsAsNumbers(t *testing.T) {
	files, types := numsTypes(t)
	m := numsMessage(t, types, "x.Base", `{"a": "5"}`)
	for name, v := range map[protoreflect.FullName]func(protoreflect.ExtensionType) protoreflect.Value{
		"x.big": func(protoreflect.ExtensionType) protoreflect.Value {
			return protoreflect.ValueOfInt64(-9223372036854775808)
		},
		"x.bigs": func(xt protoreflect.ExtensionType) protoreflect.Value {
			l := xt.New().List()
			l.Append(protoreflect.ValueOfUint64(18446744073709551615))
			l.Append(protoreflect.ValueOfUint64(0))
			return protoreflect.ValueOfList(l)
		},
	} {
		d, err := files.FindDescriptorByName(name)
		if err != nil {
			t.Fatal(err)
		}
		xt := dynamicpb.NewExtensionType(d.(protoreflect.ExtensionDescriptor))
		m.Set(xt.TypeDescriptor(), v(xt))
	}
	js, err := resultJSON(types, m)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":5,"[x.big]":-9223372036854775808,"[x.bigs]":[18446744073709551615,0]}`; string(js) != want {
		t.Errorf("\n got %s\nwant %s", js, want)
	}
}

// A response that is itself a wrapper (a tool without structuredContent)
// is written as a number too; another well-known type as protojson does.
func TestResultJSONOfAWellKnownResponse(t *testing.T) {
	_, types := numsTypes(t)
	for _, tc := range []struct {
		name     protoreflect.FullName
		in, want string
	}{
		{"google.protobuf.Int64Value", `"-9223372036854775808"`, `-9223372036854775808`},
		{"google.protobuf.UInt64Value", `"18446744073709551615"`, `18446744073709551615`},
		{"google.protobuf.Timestamp", `"2026-12-02T03:25:25Z"`, `"2026-12-02T03:25:25Z"`},
		{"google.protobuf.Value", `{"a":"1"}`, `{"a":"1"}`},
	} {
		js, err := resultJSON(types, numsMessage(t, types, tc.name, tc.in))
		if err != nil {
			t.Fatal(err)
		}
		if string(js) != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, js, tc.want)
		}
	}
}

// The output schema says a 64-bit integer is an integer (an unsigned one
// not below 0); the input schema still takes an integer or a string, as
// protojson reads either. Nothing else differs.
func TestOutputSchemaSaysInt64sAreIntegers(t *testing.T) {
	md := kitchenMessage(t, "k.Req")
	in, out := normalize(t, Schema(md)).(map[string]any), normalize(t, OutputSchema(md)).(map[string]any)
	props := in["properties"].(map[string]any)
	if _, ok := props["big"].(map[string]any)["anyOf"]; !ok {
		t.Errorf("input schema of a uint64 = %v, want an integer or a string", props["big"])
	}
	props["big"] = map[string]any{"type": "integer", "minimum": float64(0)}
	props["counts"].(map[string]any)["additionalProperties"] = map[string]any{"type": "integer"}
	props["maybe"] = map[string]any{"anyOf": []any{map[string]any{"type": "integer"}, map[string]any{"type": "null"}}}
	if !reflect.DeepEqual(out, in) {
		b, _ := json.MarshalIndent(out, "", "  ")
		t.Errorf("output schema:\n%s", b)
	}
}

// The tools advertise the output schema for their results and the input
// schema for their arguments.
func TestToolsAdvertiseIntegerResults(t *testing.T) {
	methods, err := Methods(Config{Files: protoregistry.GlobalFiles, Services: []string{"examples.payments.v1.PaymentsService"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range methods {
		if !strings.HasSuffix(m.Tool.Name, ".ChargeCard") {
			continue
		}
		in := normalize(t, m.Tool.InputSchema).(map[string]any)["properties"].(map[string]any)["amountCents"]
		out := normalize(t, m.Tool.OutputSchema).(map[string]any)["properties"].(map[string]any)["amountCents"]
		if _, ok := in.(map[string]any)["anyOf"]; !ok {
			t.Errorf("input amountCents = %v, want an integer or a string", in)
		}
		if !reflect.DeepEqual(out, map[string]any{"type": "integer"}) {
			t.Errorf("output amountCents = %v, want an integer", out)
		}
		return
	}
	t.Fatal("no ChargeCard tool")
}

// numsOut conforms to the output schema; with its integers as strings
// (protojson's own form) it would not.
func TestInt64ResultConformsToTheOutputSchema(t *testing.T) {
	files, _ := numsTypes(t)
	d, err := files.FindDescriptorByName("n.Nums")
	if err != nil {
		t.Fatal(err)
	}
	resolved := resolveSchema(t, OutputSchema(d.(protoreflect.MessageDescriptor)))
	for name, js := range map[string]string{"numbers": numsOut, "strings": strings.Replace(numsOut, `"i64":9223372036854775807`, `"i64":"9223372036854775807"`, 1)} {
		var got map[string]any
		if err := json.Unmarshal([]byte(js), &got); err != nil {
			t.Fatal(err)
		}
		err := resolved.Validate(got)
		if conforms := err == nil; conforms != (name == "numbers") {
			t.Errorf("%s: validation error %v", name, err)
		}
	}
}

func resolveSchema(t *testing.T, s map[string]any) *jsonschema.Resolved {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var schema jsonschema.Schema
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&schema); err != nil {
		t.Fatal(err)
	}
	resolved, err := schema.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	return resolved
}

package outcomejson_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/outcomejson"
	"github.com/idemgate/idemgate/internal/protoset"
)

func write(t *testing.T, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A set as buf or protoc writes it is read; a file that is not one, one
// without its imports, or none at all is refused naming the setting.
func TestReadFile(t *testing.T) {
	t.Parallel()
	set, err := protoset.Callers()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := proto.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	files, err := outcomejson.ReadFile("-descriptors", write(t, "set.binpb", raw))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outcomejson.ResponseType(files, "/examples.payments.v1.PaymentsService/ChargeCard"); err != nil {
		t.Errorf("ResponseType from the set read: %v", err)
	}
	last := set.GetFile()[len(set.GetFile())-1]
	withoutImports, _ := proto.Marshal(&descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{last}})
	for name, tt := range map[string]struct {
		path, want string
	}{
		"missing":         {filepath.Join(t.TempDir(), "none.binpb"), "-descriptors: open "},
		"empty":           {write(t, "empty.binpb", nil), "is not a FileDescriptorSet"},
		"a .proto source": {write(t, "x.proto", []byte("syntax = \"proto3\";\npackage x;\n")), "is not a FileDescriptorSet"},
		"without imports": {write(t, "partial.binpb", withoutImports), "--include_imports"},
	} {
		if _, err := outcomejson.ReadFile("-descriptors", tt.path); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, tt.want)
		}
	}
}

// JSON of a method's response packs as the interceptor stores the
// response, and decodes back to the same JSON.
func TestFromJSONAndBack(t *testing.T) {
	t.Parallel()
	md, err := outcomejson.ResponseType(protoregistry.GlobalFiles, "/examples.payments.v1.PaymentsService/ChargeCard")
	if err != nil {
		t.Fatal(err)
	}
	types := outcomejson.Types(nil)
	a, err := outcomejson.FromJSON(md, []byte(`{"chargeId": "ch_1", "amountCents": "4200"}`), types)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(&paymentsv1.ChargeCardResponse{ChargeId: "ch_1", AmountCents: 4200})
	if a.GetTypeUrl() != "type.googleapis.com/examples.payments.v1.ChargeCardResponse" || string(a.GetValue()) != string(want) {
		t.Fatalf("FromJSON: %v, want the response's bytes under its type URL", a)
	}
	text, name, err := outcomejson.ToJSON(a, types)
	if err != nil || name != "examples.payments.v1.ChargeCardResponse" || !strings.Contains(string(text), `"chargeId": "ch_1"`) {
		t.Fatalf("ToJSON: %s %s %v", text, name, err)
	}
	if _, err := outcomejson.FromJSON(md, []byte(`{"chargeId": 1}`), types); err == nil || !strings.Contains(err.Error(), "not a valid examples.payments.v1.ChargeCardResponse") {
		t.Errorf("FromJSON of the wrong JSON: %v", err)
	}
	if _, err := outcomejson.ResponseType(protoregistry.GlobalFiles, "/shop.v1.Orders/Place"); !errors.Is(err, outcomejson.ErrUnknownMethod) {
		t.Errorf("ResponseType of an unknown method: %v, want ErrUnknownMethod", err)
	}
	a.TypeUrl = "type.googleapis.com/shop.v1.Order"
	if _, _, err := outcomejson.ToJSON(a, types); !errors.Is(err, protoregistry.NotFound) {
		t.Errorf("ToJSON of an unknown type: %v, want NotFound", err)
	}
}

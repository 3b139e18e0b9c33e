package interceptor

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// FuzzFingerprint checks, for any request, that the fingerprint is stable,
// ignores the key field and the excluded fields, and sees every other change.
func FuzzFingerprint(f *testing.F) {
	seed := func(m *testingv1.MutateRequest) {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	seed(&testingv1.MutateRequest{Payload: "charge"})
	seed(&testingv1.MutateRequest{Payload: "charge", RequestId: "k", ClientTimestamp: "t", Meta: &testingv1.Meta{TraceId: "x", Note: "n"},
		Labels: map[string]string{"a": "1", "b": "2", "c": "3"}})
	gate, err := New(idemgatev1.NewDedupeServiceClient(nil))
	if err != nil {
		f.Fatal(err)
	}
	m := gate.methods[testingv1.TestService_Mutate_FullMethodName]

	f.Fuzz(func(t *testing.T, wire []byte) {
		req := &testingv1.MutateRequest{}
		if proto.Unmarshal(wire, req) != nil {
			return
		}
		fp, err := m.fingerprint(req)
		if err != nil {
			t.Fatal(err)
		}
		if again, _ := m.fingerprint(proto.Clone(req)); !bytes.Equal(fp, again) {
			t.Fatal("the fingerprint of a copy differs")
		}
		noise := proto.Clone(req).(*testingv1.MutateRequest)
		noise.RequestId += "-other"
		noise.ClientTimestamp += "-later"
		if noise.Meta == nil {
			noise.Meta = &testingv1.Meta{}
		}
		noise.Meta.TraceId += "-other"
		if req.Meta == nil {
			// An absent Meta and an empty one encode alike only when Meta
			// stays empty apart from excluded fields: compare like with like.
			req = proto.Clone(req).(*testingv1.MutateRequest)
			req.Meta = &testingv1.Meta{}
			fp, _ = m.fingerprint(req)
		}
		if got, _ := m.fingerprint(noise); !bytes.Equal(fp, got) {
			t.Fatal("changing only the key field and excluded fields changed the fingerprint")
		}
		changed := proto.Clone(req).(*testingv1.MutateRequest)
		changed.Payload += "!"
		if got, _ := m.fingerprint(changed); bytes.Equal(fp, got) {
			t.Fatal("changing the payload left the fingerprint unchanged")
		}
	})
}

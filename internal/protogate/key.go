package protogate

import (
	"crypto/sha256"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/keys"
)

// DerivedKeyPrefix starts every key derived from a keyless call's
// fingerprint, so it never collides with a caller's key of the same text.
const DerivedKeyPrefix = "derived:"

// Key returns the call's idempotency key from the values of its carrier (the
// idempotency-key metadata or header, every value the call sent) or the
// request's key field, "" for a keyless call the policy deduplicates on its
// fingerprint, or the status error to refuse the call with. carrier names
// the carrier in those errors ("the idempotency-key metadata").
func (m *Method) Key(carrier string, values []string, req proto.Message) (string, error) {
	key, hasKey := "", len(values) > 0
	if hasKey {
		key = values[0]
		for _, v := range values[1:] {
			if v != key {
				return "", grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyInvalid,
					carrier+" has more than one value; send exactly one key", nil, 0)
			}
		}
	}
	if m.keyField != nil {
		if fieldKey := req.ProtoReflect().Get(m.keyField).String(); fieldKey != "" {
			if hasKey && fieldKey != key {
				return "", grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyConflict,
					fmt.Sprintf("%s and the request field %s carry different idempotency keys; send one, or the same in both", carrier, m.keyField.Name()),
					map[string]string{"field": string(m.keyField.Name())}, 0)
			}
			key, hasKey = fieldKey, true
		}
	}
	if !hasKey {
		if m.Policy.KeylessFingerprint {
			return "", nil
		}
		where := carrier
		if m.keyField != nil {
			where += " or the request field " + string(m.keyField.Name())
		}
		return "", grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyMissing,
			"this method has side effects and needs an idempotency key: send one in "+where+", minted once per logical action and reused on every retry of it",
			nil, 0)
	}
	if err := keys.Validate(key); err != nil {
		return "", grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyInvalid,
			"the idempotency key "+err.Error()+": use 1 to 255 bytes of printable ASCII without leading or trailing spaces, such as a UUID", nil, 0)
	}
	return key, nil
}

// Fingerprint hashes the deterministic encoding of the request, without its
// key field and its fields marked exclude_from_fingerprint. Deterministic
// encoding sorts map entries, so map order never changes it.
func (m *Method) Fingerprint(req proto.Message) ([]byte, error) {
	if m.scrub {
		req = proto.Clone(req)
		if m.keyField != nil {
			req.ProtoReflect().Clear(m.keyField)
		}
		clearExcluded(req.ProtoReflect())
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

// clearExcluded clears every populated field marked exclude_from_fingerprint
// in msg and in the messages it holds.
func clearExcluded(msg protoreflect.Message) {
	msg.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case FieldPolicy(fd).GetExcludeFromFingerprint():
			msg.Clear(fd)
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					clearExcluded(mv.Message())
					return true
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				list := v.List()
				for i := range list.Len() {
					clearExcluded(list.Get(i).Message())
				}
			}
		case fd.Message() != nil:
			clearExcluded(v.Message())
		}
		return true
	})
}

// Scope joins the action and the tenant. An action never holds "|", so the
// first "|" splits the two unambiguously.
func Scope(action, tenant string) string {
	if tenant == "" {
		return action
	}
	var b strings.Builder
	b.Grow(len(action) + 1 + len(tenant))
	b.WriteString(action)
	b.WriteByte('|')
	b.WriteString(tenant)
	return b.String()
}

// CorePolicy is what the engine needs of m's policy.
func (m *Method) CorePolicy() gatecore.Policy {
	p := m.Policy
	return gatecore.Policy{Lease: p.Lease, MaxWait: p.MaxWait, OnLostOutcome: p.OnLostOutcome, ExecutionTimeout: p.ExecutionTimeout,
		FinishAfterReply: p.FinishAfterReply}
}

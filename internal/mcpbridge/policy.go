package mcpbridge

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// Class is how the bridge sees a method's policy, read from its descriptor
// the way the tool server's gate reads it.
type Class int

const (
	// Unclassified: neither marked mutating nor given a safe
	// idempotency_level. The gate does not gate it; the bridge advertises it
	// as a possibly destructive, non-idempotent tool.
	Unclassified Class = iota
	// ReadOnly: idempotency_level NO_SIDE_EFFECTS. Never gated, no key.
	ReadOnly
	// Idempotent: idempotency_level IDEMPOTENT. Never gated: the method is
	// safe to repeat by itself.
	Idempotent
	// NotMutating: (idemgate.v1.policy) = {mutating: false}, a recorded
	// decision that the method is not gated.
	NotMutating
	// Gated: marked mutating with no safe idempotency_level. The gate runs it
	// once per idempotency key.
	Gated
)

// String names the class: "unclassified", "read_only", "idempotent",
// "not_mutating" or "gated".
func (c Class) String() string {
	switch c {
	case ReadOnly:
		return "read_only"
	case Idempotent:
		return "idempotent"
	case NotMutating:
		return "not_mutating"
	case Gated:
		return "gated"
	}
	return "unclassified"
}

// Classify reads md's options as the gate does: a method is gated only when
// it is marked mutating and its idempotency_level is not NO_SIDE_EFFECTS or
// IDEMPOTENT. The (idemgate.v1.policy) extension must be resolvable when the
// descriptor's options were decoded; this package links it, so descriptors
// decoded in this process (a descriptor set, reflection) carry it.
func Classify(md protoreflect.MethodDescriptor) Class {
	opts, _ := md.Options().(*descriptorpb.MethodOptions)
	switch opts.GetIdempotencyLevel() {
	case descriptorpb.MethodOptions_NO_SIDE_EFFECTS:
		return ReadOnly
	case descriptorpb.MethodOptions_IDEMPOTENT:
		return Idempotent
	}
	if opts == nil || !proto.HasExtension(opts, idemgatev1.E_Policy) {
		return Unclassified
	}
	if proto.GetExtension(opts, idemgatev1.E_Policy).(*idemgatev1.MethodPolicy).GetMutating() {
		return Gated
	}
	return NotMutating
}

// keylessAllowed reports whether a gated method accepts calls without a key
// (keyless FINGERPRINT).
func keylessAllowed(md protoreflect.MethodDescriptor) bool {
	opts, _ := md.Options().(*descriptorpb.MethodOptions)
	if opts == nil {
		return false
	}
	p, _ := proto.GetExtension(opts, idemgatev1.E_Policy).(*idemgatev1.MethodPolicy)
	return p.GetKeyless() == idemgatev1.KeylessPolicy_KEYLESS_POLICY_FINGERPRINT
}

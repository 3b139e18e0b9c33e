package protogate

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/keys"
)

// Policy defaults, used when a method's (idemgate.v1.policy) leaves a field
// unset (interceptor re-exports them).
const (
	// DefaultRetention is how long an outcome is replayed: 24h.
	DefaultRetention = gatecore.DefaultRetention
	// DefaultLease is how long a reservation is held without a heartbeat
	// before it counts as abandoned: 10s. The interceptor renews it about
	// every third of the lease while the handler runs.
	DefaultLease = gatecore.DefaultLease
	// DefaultMaxWait is how long a duplicate waits for an in-flight
	// original's outcome before it gets ABORTED: 3s.
	DefaultMaxWait = gatecore.DefaultMaxWait
	// MaxMaxWait is the longest max_wait a policy may set: 60s.
	MaxMaxWait = gatecore.MaxMaxWait
	// DefaultKeylessWindow is how long a keyless call is deduplicated under
	// KEYLESS_POLICY_FINGERPRINT when the policy sets no window: 60s.
	DefaultKeylessWindow = gatecore.DefaultKeylessWindow
	// MinLease is the shortest lease a policy may set: 1s.
	MinLease = gatecore.MinLease
	// MaxRetention is the longest retention a policy may set: 365 days.
	MaxRetention = gatecore.MaxRetention
	// MaxLease is the longest lease a policy may set: 24h, the longest the
	// Dedupe service renews a lease to.
	MaxLease = gatecore.MaxLease
	// DefaultExecutionTimeout bounds a handler's run when the policy sets no
	// execution_timeout: 60s.
	DefaultExecutionTimeout = gatecore.DefaultExecutionTimeout
	// MinExecutionTimeout and MaxExecutionTimeout bound execution_timeout:
	// 1s and 24h.
	MinExecutionTimeout = gatecore.MinExecutionTimeout
	MaxExecutionTimeout = gatecore.MaxExecutionTimeout
	// MaxActionBytes is the longest action name a policy may set: 255 bytes.
	MaxActionBytes = 255
)

// Method is what a gate needs of one gated method at call time, resolved
// once from its descriptor.
type Method struct {
	// Policy is the method's resolved policy.
	Policy idemgate.Policy
	// Output makes the method's response message to replay into.
	Output protoreflect.MessageType
	// OutputName is the response's full name, checked against the stored
	// outcome's type URL.
	OutputName protoreflect.FullName
	// Reconcile is the method's Reconciler, or nil.
	Reconcile idemgate.Reconciler
	// replay holds Policy.ReplayCodes for a lookup per error.
	replay map[codes.Code]bool
	// unknown holds Policy.UnknownCodes and the two codes always in it.
	unknown map[codes.Code]bool
	// keyField is the request's top-level string field marked
	// (idemgate.v1.field).idempotency_key, or nil.
	keyField protoreflect.FieldDescriptor
	// scrub reports whether the request must be copied and cleared of the
	// key field and excluded fields before it is fingerprinted.
	scrub bool
}

// KeyField is the request's top-level string field marked
// (idemgate.v1.field).idempotency_key, or nil.
func (m *Method) KeyField() protoreflect.FieldDescriptor { return m.keyField }

// Resolved is every method's classification, read once from descriptors.
type Resolved struct {
	// Gated holds the gated methods by full method name
	// ("/pkg.Service/Method", which is also a Connect procedure).
	Gated map[string]*Method
	// Unclassified lists methods neither marked mutating nor declared safe
	// by idempotency_level: a policy decision nobody made.
	Unclassified []string
	// Services holds the full name of every service the descriptors know.
	Services map[string]bool
}

// Resolve walks every service in files and resolves each method; a response
// type that types lacks is replayed as a dynamicpb message. It fails, naming
// each, when a method's policy is inconsistent or a reconciler names a method
// that is not gated: every misconfigured method is reported, not only the
// first.
func Resolve(files *protoregistry.Files, types *protoregistry.Types, reconcilers map[string]idemgate.Reconciler) (Resolved, error) {
	r := Resolved{Gated: map[string]*Method{}, Services: map[string]bool{}}
	var errs []error
	files.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		services := fd.Services()
		for i := range services.Len() {
			r.Services[string(services.Get(i).FullName())] = true
			methods := services.Get(i).Methods()
			for j := range methods.Len() {
				md := methods.Get(j)
				fullMethod := fmt.Sprintf("/%s/%s", md.Parent().FullName(), md.Name())
				policy, err := methodPolicy(md)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				if !policy.Gated {
					if unclassified(md) {
						r.Unclassified = append(r.Unclassified, fullMethod)
					}
					continue
				}
				m, err := newMethod(md, policy, types)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				m.Reconcile = reconcilers[fullMethod]
				r.Gated[fullMethod] = m
			}
		}
		return true
	})
	errs = append(errs, sharedActions(r.Gated)...)
	for fullMethod := range reconcilers {
		if _, ok := r.Gated[fullMethod]; !ok {
			errs = append(errs, fmt.Errorf("idemgate: a reconciler is registered for %s, which is not a gated method", fullMethod))
		}
	}
	if len(errs) > 0 {
		return Resolved{}, errors.Join(errs...)
	}
	sort.Strings(r.Unclassified)
	return r, nil
}

func newMethod(md protoreflect.MethodDescriptor, policy idemgate.Policy, types *protoregistry.Types) (*Method, error) {
	m := &Method{
		Policy:     policy,
		Output:     messageType(types, md.Output()),
		OutputName: md.Output().FullName(),
		replay:     map[codes.Code]bool{},
		unknown:    map[codes.Code]bool{codes.DeadlineExceeded: true, codes.Canceled: true},
	}
	for _, c := range policy.ReplayCodes {
		m.replay[c] = true
	}
	for _, c := range policy.UnknownCodes {
		m.unknown[c] = true
	}
	input := md.Input()
	fields := input.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !FieldPolicy(fd).GetIdempotencyKey() {
			continue
		}
		if fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated || fd.ContainingOneof() != nil && !fd.ContainingOneof().IsSynthetic() {
			return nil, fmt.Errorf("idemgate: method %s: field %s is marked idempotency_key, but only a plain string field can carry the key", md.FullName(), fd.FullName())
		}
		if m.keyField != nil {
			return nil, fmt.Errorf("idemgate: method %s: fields %s and %s are both marked idempotency_key; mark one", md.FullName(), m.keyField.FullName(), fd.FullName())
		}
		m.keyField = fd
	}
	m.scrub = m.keyField != nil || hasExcluded(input, map[protoreflect.FullName]bool{})
	return m, nil
}

// hasExcluded reports whether md or any message it holds has a field marked
// exclude_from_fingerprint. seen breaks recursive message types.
func hasExcluded(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if FieldPolicy(fd).GetExcludeFromFingerprint() {
			return true
		}
		if fd.IsMap() {
			fd = fd.MapValue()
		}
		if fd.Message() != nil && hasExcluded(fd.Message(), seen) {
			return true
		}
	}
	return false
}

// FieldPolicy is fd's (idemgate.v1.field), or nil.
func FieldPolicy(fd protoreflect.FieldDescriptor) *idemgatev1.FieldPolicy {
	opts, _ := fd.Options().(*descriptorpb.FieldOptions)
	if opts == nil || !proto.HasExtension(opts, idemgatev1.E_Field) {
		return nil
	}
	p, _ := proto.GetExtension(opts, idemgatev1.E_Field).(*idemgatev1.FieldPolicy)
	return p
}

// unclassified reports whether md is a method nobody decided about: not
// marked mutating, no safe idempotency_level, and not one of gRPC's own
// services (health, reflection), which no tool author annotates.
func unclassified(md protoreflect.MethodDescriptor) bool {
	if strings.HasPrefix(string(md.FullName()), "grpc.") {
		return false
	}
	opts, _ := md.Options().(*descriptorpb.MethodOptions)
	if opts.GetIdempotencyLevel() != descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN {
		return false
	}
	if opts != nil && proto.HasExtension(opts, idemgatev1.E_Policy) {
		return false // a policy that says mutating: false is a decision
	}
	return true
}

// methodPolicy reads md's (idemgate.v1.policy) and idempotency_level.
func methodPolicy(md protoreflect.MethodDescriptor) (idemgate.Policy, error) {
	opts, _ := md.Options().(*descriptorpb.MethodOptions)
	if opts == nil || !proto.HasExtension(opts, idemgatev1.E_Policy) {
		return idemgate.Policy{}, nil
	}
	raw, _ := proto.GetExtension(opts, idemgatev1.E_Policy).(*idemgatev1.MethodPolicy)
	if !raw.GetMutating() {
		return idemgate.Policy{}, nil
	}
	name := md.FullName()
	switch opts.GetIdempotencyLevel() {
	case descriptorpb.MethodOptions_NO_SIDE_EFFECTS:
		return idemgate.Policy{}, fmt.Errorf("idemgate: method %s is marked both mutating and idempotency_level = NO_SIDE_EFFECTS: remove one of them", name)
	case descriptorpb.MethodOptions_IDEMPOTENT:
		return idemgate.Policy{}, nil // safe to repeat by its own declaration
	}
	if md.IsStreamingClient() || md.IsStreamingServer() {
		return idemgate.Policy{}, fmt.Errorf("idemgate: streaming method %s is marked mutating, but only unary methods can be gated: a stream's outcome is not one message to store and replay", name)
	}
	p := idemgate.Policy{Gated: true, Retention: DefaultRetention, Lease: DefaultLease, MaxWait: DefaultMaxWait,
		OnLostOutcome:    idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED,
		ExecutionTimeout: DefaultExecutionTimeout,
		Action:           fmt.Sprintf("/%s/%s", md.Parent().FullName(), md.Name())}
	if a := raw.GetAction(); a != "" {
		if err := validAction(a); err != nil {
			return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy action %q %v", name, a, err)
		}
		p.Action = a
	}
	if d := raw.GetExecutionTimeout(); d != nil {
		if err := d.CheckValid(); err != nil {
			return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy execution_timeout: %w", name, err)
		}
		p.ExecutionTimeout = d.AsDuration()
		if p.ExecutionTimeout < MinExecutionTimeout || p.ExecutionTimeout > MaxExecutionTimeout {
			return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy execution_timeout %s is outside %s to %s", name, p.ExecutionTimeout, MinExecutionTimeout, MaxExecutionTimeout)
		}
	}
	switch raw.GetOnLostOutcome() {
	case idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_UNSPECIFIED, idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED:
	case idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_REEXECUTE:
		p.OnLostOutcome = raw.GetOnLostOutcome()
	default:
		return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy on_lost_outcome %d is not a LostOutcomePolicy", name, raw.GetOnLostOutcome())
	}
	for _, codeText := range raw.GetReplayCodes() {
		c, ok := grpcerr.CodeByName(codeText)
		if !ok || c == codes.OK {
			return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy replay_codes has %q, which is not an error code name such as \"INVALID_ARGUMENT\"", name, codeText)
		}
		p.ReplayCodes = append(p.ReplayCodes, c)
	}
	for _, codeText := range raw.GetUnknownCodes() {
		c, ok := grpcerr.CodeByName(codeText)
		if !ok || c == codes.OK {
			return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy unknown_codes has %q, which is not an error code name such as \"INTERNAL\"", name, codeText)
		}
		if slices.Contains(p.ReplayCodes, c) {
			return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy lists %s in both replay_codes and unknown_codes: an error is either a final outcome or an unknown one", name, codeText)
		}
		p.UnknownCodes = append(p.UnknownCodes, c)
	}
	switch raw.GetFinish() {
	case idemgatev1.FinishPolicy_FINISH_POLICY_UNSPECIFIED, idemgatev1.FinishPolicy_FINISH_POLICY_BEFORE_REPLY:
	case idemgatev1.FinishPolicy_FINISH_POLICY_AFTER_REPLY:
		p.FinishAfterReply = true
	default:
		return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy finish %d is not a FinishPolicy", name, raw.GetFinish())
	}
	switch raw.GetKeyless() {
	case idemgatev1.KeylessPolicy_KEYLESS_POLICY_UNSPECIFIED, idemgatev1.KeylessPolicy_KEYLESS_POLICY_REJECT:
	case idemgatev1.KeylessPolicy_KEYLESS_POLICY_FINGERPRINT:
		p.KeylessFingerprint = true
		p.KeylessWindow = DefaultKeylessWindow
		if d := raw.GetKeylessWindow(); d != nil {
			if err := d.CheckValid(); err != nil {
				return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy keyless_window: %w", name, err)
			}
			p.KeylessWindow = d.AsDuration()
		}
	default:
		return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy keyless %d is not a KeylessPolicy", name, raw.GetKeyless())
	}
	if d := raw.GetMaxWait(); d != nil {
		if err := d.CheckValid(); err != nil {
			return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy max_wait: %w", name, err)
		}
		p.MaxWait = d.AsDuration()
		if p.MaxWait < 0 || p.MaxWait > MaxMaxWait {
			return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy max_wait %s is outside 0s to %s", name, p.MaxWait, MaxMaxWait)
		}
	}
	if d := raw.GetRetention(); d != nil {
		if err := d.CheckValid(); err != nil {
			return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy retention: %w", name, err)
		}
		p.Retention = d.AsDuration()
	}
	if d := raw.GetLease(); d != nil {
		if err := d.CheckValid(); err != nil {
			return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy lease: %w", name, err)
		}
		p.Lease = d.AsDuration()
	}
	switch {
	case p.Lease < MinLease || p.Lease > MaxLease:
		return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy lease %s is outside %s to %s", name, p.Lease, MinLease, MaxLease)
	case p.Retention > MaxRetention:
		return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy retention %s is above the maximum %s", name, p.Retention, MaxRetention)
	case p.Retention < p.Lease:
		return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy retention %s is shorter than its lease %s: an outcome must outlive its reservation", name, p.Retention, p.Lease)
	case p.KeylessFingerprint && (p.KeylessWindow < p.Lease || p.KeylessWindow > p.Retention):
		return idemgate.Policy{}, fmt.Errorf("idemgate: method %s: policy keyless_window %s must be between the lease %s and the retention %s", name, p.KeylessWindow, p.Lease, p.Retention)
	}
	return p, nil
}

// sharedActions reports every pair of gated methods that name one action
// but answer different response types: a record of one could never replay
// as the other's response.
func sharedActions(gated map[string]*Method) []error {
	methods := make([]string, 0, len(gated))
	for fullMethod := range gated {
		methods = append(methods, fullMethod)
	}
	sort.Strings(methods)
	first := map[string]string{}
	var errs []error
	for _, fullMethod := range methods {
		m := gated[fullMethod]
		other, seen := first[m.Policy.Action]
		if !seen {
			first[m.Policy.Action] = fullMethod
			continue
		}
		if gated[other].OutputName != m.OutputName {
			errs = append(errs, fmt.Errorf("idemgate: methods %s and %s share the action %q but return %s and %s: a shared action must keep its response type",
				other, fullMethod, m.Policy.Action, gated[other].OutputName, m.OutputName))
		}
	}
	return errs
}

// validAction checks a policy's action name: it becomes the first part of
// every record's scope, and "|" separates that from the tenant.
func validAction(a string) error {
	switch {
	case len(a) > MaxActionBytes:
		return fmt.Errorf("is longer than %d bytes", MaxActionBytes)
	case !keys.Printable(a):
		return fmt.Errorf("must be printable ASCII")
	case strings.Contains(a, "|"):
		return fmt.Errorf("must not contain \"|\", which separates the action from the tenant")
	}
	return nil
}

func messageType(types *protoregistry.Types, md protoreflect.MessageDescriptor) protoreflect.MessageType {
	if mt, err := types.FindMessageByName(md.FullName()); err == nil {
		return mt
	}
	return dynamicpb.NewMessageType(md)
}

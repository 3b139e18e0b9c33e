package protogate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/vocab"
)

// ToStatus is how a front end reads a handler's error as a gRPC status
// (status.Convert for gRPC; a Connect error's code, message and details for
// Connect).
type ToStatus func(error) *status.Status

// Reconciled asks m's Reconciler what happened to a lost outcome of the
// call with key and req, as the core stores it. A reconciler that fails
// leaves the outcome unknown (IDEMPOTENCY_OUTCOME_UNKNOWN); one that answers
// a response of another type, or one that does not serialize, too, and the
// caller gets INTERNAL (gatecore.BadResolution). label names the method in
// those errors.
func (m *Method) Reconciled(ctx context.Context, label, key string, req proto.Message, toStatus ToStatus) (gatecore.Resolution, error) {
	res, err := m.Reconcile(ctx, key, req)
	if err != nil {
		return gatecore.StillUnknown(), err
	}
	kind, response, resErr := vocab.Read(res)
	switch kind {
	case vocab.ResolvedResponse:
		if response == nil || response.ProtoReflect().Descriptor().FullName() != m.OutputName {
			return gatecore.StillUnknown(), gatecore.BadResolution(fmt.Errorf("the reconciler of %s answered %T, not a %s", label, response, m.OutputName))
		}
		outcome, err := gatecore.MarshalAny(response)
		if err != nil {
			return gatecore.StillUnknown(), gatecore.BadResolution(fmt.Errorf("serialize the reconciler's response: %w", err))
		}
		return gatecore.ResolvedOutcome(outcome), nil
	case vocab.ResolvedError:
		outcome, err := gatecore.MarshalAny(toStatus(resErr).Proto())
		if err != nil {
			return gatecore.StillUnknown(), gatecore.BadResolution(fmt.Errorf("serialize the reconciler's error: %w", err))
		}
		return gatecore.ResolvedOutcome(outcome), nil
	case vocab.ResolvedNotRun:
		return gatecore.ResolvedNotRun(), nil
	}
	return gatecore.StillUnknown(), nil
}

// Classify decides what a handler error means and returns its status and
// the error to hand back (the mark removed). A mark decides first, then
// replay_codes, then the unknown class (context errors, DEADLINE_EXCEEDED,
// CANCELLED, unknown_codes); any other error frees the key.
func (m *Method) Classify(err error, toStatus ToStatus) (verdict gatecore.Verdict, st *status.Status, unwrapped error) {
	if v, inner, ok := gatecore.Marked(err); ok {
		return v, toStatus(inner), inner
	}
	st = toStatus(err)
	switch {
	case m.replay[st.Code()]:
		return gatecore.VerdictOutcome, st, err
	case m.unknown[st.Code()], errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return gatecore.VerdictUnknown, st, err
	}
	return gatecore.VerdictNotRun, st, err
}

// A duplicate must see what the first caller saw, response metadata
// included, so a front end records the handler's header and trailer and
// stores them with its outcome (idemgate.v1.StoredOutcome). Keys are stored
// lowercase, values as raw bytes (a "-bin" value decoded), so a record
// replays alike over gRPC and Connect.

// Metadata is a header or trailer as stored: lowercase keys, each with its
// values in the order they were set.
type Metadata map[string][]string

// Add appends vs to k, lowercased as every transport sends it.
func (md *Metadata) Add(k string, vs ...string) {
	if *md == nil {
		*md = Metadata{}
	}
	k = strings.ToLower(k)
	(*md)[k] = append((*md)[k], vs...)
}

// Wrap returns the outcome to store for result, gatecore.MarshalAny's
// answer: result itself when header and trailer hold nothing replayable
// (keep says which keys are), so such records keep the bytes and the format
// they always had, else a StoredOutcome that holds result, header and
// trailer. An error passes through.
func Wrap(result *anypb.Any, err error, header, trailer Metadata, keep func(string) bool) (*anypb.Any, error) {
	if err != nil {
		return result, err
	}
	h, t := entries(header, keep), entries(trailer, keep)
	if len(h) == 0 && len(t) == 0 {
		return result, nil
	}
	return gatecore.MarshalAny(&idemgatev1.StoredOutcome{Result: result, Header: h, Trailer: t})
}

// entries returns the replayable keys of md, sorted, each with its values in
// the order they were set.
func entries(md Metadata, keep func(string) bool) []*idemgatev1.MetadataEntry {
	var out []*idemgatev1.MetadataEntry
	for k, vs := range md {
		if !keep(k) || len(vs) == 0 {
			continue
		}
		values := make([][]byte, len(vs))
		for i, v := range vs {
			values[i] = []byte(v)
		}
		out = append(out, &idemgatev1.MetadataEntry{Key: k, Values: values})
	}
	slices.SortFunc(out, func(a, b *idemgatev1.MetadataEntry) int { return strings.Compare(a.GetKey(), b.GetKey()) })
	return out
}

// ReplayableKey reports whether a handler's metadata key (lowercase) is
// replayed by every gate: not a pseudo-header, nor in the "grpc-" namespace
// (grpc-status, grpc-message, grpc-status-details-bin, which a replayed
// error carries by itself), nor content-type, te or user-agent, which the
// transport owns, nor one of own, the gate's own headers, which it sets on
// every replay.
func ReplayableKey(k string, own ...string) bool {
	if k == "" || k[0] == ':' || strings.HasPrefix(k, "grpc-") {
		return false
	}
	switch k {
	case "content-type", "te", "user-agent":
		return false
	}
	return !slices.Contains(own, k)
}

// StoredOutcomeName and StatusName are the full names of a stored outcome
// with metadata and of a stored final error.
var (
	StoredOutcomeName = (&idemgatev1.StoredOutcome{}).ProtoReflect().Descriptor().FullName()
	StatusName        = (&spb.Status{}).ProtoReflect().Descriptor().FullName()
)

// Replayed is a stored outcome as a gate replays it: the response or the
// final error, and the metadata the handler set.
type Replayed struct {
	// Response is the method's response (m.Output), or nil for an error.
	Response proto.Message
	// Err is the final error, a status error, or nil for a response.
	Err error
	// Header and Trailer are what the handler set.
	Header, Trailer Metadata
}

// Decode returns what a stored outcome replays for m. It fails, with the
// error to answer, when the outcome is not one m can replay: a
// ResultTooLarge marker, another type, bytes that do not decode. That is
// never a reason to run the handler again.
func (m *Method) Decode(outcome *anypb.Any) (Replayed, error) {
	var r Replayed
	if outcome.MessageName() == StoredOutcomeName {
		stored := &idemgatev1.StoredOutcome{}
		if err := proto.Unmarshal(outcome.GetValue(), stored); err != nil {
			return Replayed{}, grpcerr.New(codes.Internal, idemgate.ReasonOutcomeTypeMismatch,
				fmt.Sprintf("the stored outcome does not decode: %v; the call was not run again", err), nil, 0)
		}
		outcome, r.Header, r.Trailer = stored.GetResult(), metadataOf(stored.GetHeader()), metadataOf(stored.GetTrailer())
	}
	if err := gatecore.TooLarge(outcome); err != nil {
		return Replayed{}, err
	}
	if outcome.MessageName() == StatusName {
		st := &spb.Status{}
		if err := proto.Unmarshal(outcome.GetValue(), st); err != nil {
			return Replayed{}, grpcerr.New(codes.Internal, idemgate.ReasonOutcomeTypeMismatch,
				fmt.Sprintf("the stored error outcome does not decode: %v; the call was not run again", err), nil, 0)
		}
		r.Err = status.FromProto(st).Err()
		return r, nil
	}
	if outcome.MessageName() != m.OutputName {
		return Replayed{}, grpcerr.New(codes.Internal, idemgate.ReasonOutcomeTypeMismatch,
			fmt.Sprintf("the stored outcome is a %s, not this method's response type %s; the call was not run again", outcome.MessageName(), m.OutputName),
			nil, 0)
	}
	resp := m.Output.New().Interface()
	if err := proto.Unmarshal(outcome.GetValue(), resp); err != nil {
		return Replayed{}, grpcerr.New(codes.Internal, idemgate.ReasonOutcomeTypeMismatch,
			fmt.Sprintf("the stored outcome does not decode as %s: %v; the call was not run again", m.OutputName, err), nil, 0)
	}
	r.Response = resp
	return r, nil
}

func metadataOf(entries []*idemgatev1.MetadataEntry) Metadata {
	if len(entries) == 0 {
		return nil
	}
	md := make(Metadata, len(entries))
	for _, e := range entries {
		for _, v := range e.GetValues() {
			md[e.GetKey()] = append(md[e.GetKey()], string(v))
		}
	}
	return md
}

// ResultTypeURL names the type of the result an outcome holds, looking
// inside a StoredOutcome, so a ResultTooLarge marker names the response.
func ResultTypeURL(outcome *anypb.Any) string {
	if outcome.MessageName() == StoredOutcomeName {
		stored := &idemgatev1.StoredOutcome{}
		if proto.Unmarshal(outcome.GetValue(), stored) == nil {
			return stored.GetResult().GetTypeUrl()
		}
	}
	return outcome.GetTypeUrl()
}

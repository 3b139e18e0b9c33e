package dedupesvc

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// AdminServer implements idemgatev1.AdminServiceServer: what an operator
// (idemctl) needs to inspect and settle records of every calling service.
// Install an authenticator (dedupesvc/auth) so only admins reach it.
type AdminServer struct {
	idemgatev1.UnimplementedAdminServiceServer
	store     Store
	inspector Inspector
	forgetter Forgetter // nil when the store cannot forget
	service   *Server
}

// NewAdminServer returns the admin service over store, which must also be
// an Inspector (both bundled stores are). service is the Dedupe service whose
// validation and error mapping it shares.
func NewAdminServer(store Store, service *Server) (*AdminServer, error) {
	inspector, ok := store.(Inspector)
	if !ok {
		return nil, fmt.Errorf("dedupesvc: the store %T cannot list records (it is not a dedupesvc.Inspector)", store)
	}
	forgetter, _ := store.(Forgetter)
	return &AdminServer{store: store, inspector: inspector, forgetter: forgetter, service: service}, nil
}

func storedID(ref *idemgatev1.RecordRef) (RecordID, error) {
	if err := checkText("ref.namespace", "ref.namespace", ref.GetNamespace(), MaxNamespaceBytes); err != nil {
		return RecordID{}, err
	}
	if err := validateRecordID(ref.GetScope(), ref.GetKey(), "admin"); err != nil {
		return RecordID{}, err
	}
	return RecordID{Namespace: ref.GetNamespace(), Scope: ref.GetScope(), Key: ref.GetKey()}, nil
}

func toProto(r StoredRecord) *idemgatev1.Record {
	out := &idemgatev1.Record{
		Ref:            &idemgatev1.RecordRef{Namespace: r.ID.Namespace, Scope: r.ID.Scope, Key: r.ID.Key},
		State:          r.State,
		Epoch:          r.Epoch,
		OutcomeTypeUrl: r.Outcome.TypeURL,
		OutcomeSize:    r.OutcomeSize,
		LeaseExpiresAt: timestamppb.New(r.LeaseExpiresAt),
		ExpiresAt:      timestamppb.New(r.ExpiresAt),
	}
	if !r.CompletedAt.IsZero() {
		out.CompletedAt = timestamppb.New(r.CompletedAt)
	}
	if r.ReplayCount > 0 {
		out.ReplayCount = r.ReplayCount
		out.LastReplayedAt = timestamppb.New(r.LastReplayedAt)
	}
	return out
}

// GetRecord implements idemgatev1.AdminServiceServer.
func (a *AdminServer) GetRecord(ctx context.Context, req *idemgatev1.GetRecordRequest) (*idemgatev1.GetRecordResponse, error) {
	id, err := storedID(req.GetRef())
	if err != nil {
		return nil, err
	}
	r, found, err := a.inspector.GetRecord(ctx, id)
	if err != nil {
		return nil, a.service.storeError(ctx, "GetRecord", err)
	}
	if !found {
		return nil, grpcerr.New(codes.NotFound, ReasonRecordNotFound, "no record for this namespace, scope and key", nil, 0)
	}
	out := toProto(r)
	if req.GetIncludeOutcome() && r.State == StateCompleted {
		// Opened like a replay, so the operator sees what duplicates get;
		// one that cannot be opened is reported beside the record rather
		// than hiding it.
		value, err := a.service.openOutcome(ctx, id, r.Outcome)
		if err != nil {
			out.OutcomeError = status.Convert(err).Message()
		} else {
			out.Outcome = &anypb.Any{TypeUrl: r.Outcome.TypeURL, Value: value}
		}
	}
	return &idemgatev1.GetRecordResponse{Record: out}, nil
}

// ListRecords implements idemgatev1.AdminServiceServer.
func (a *AdminServer) ListRecords(ctx context.Context, req *idemgatev1.ListRecordsRequest) (*idemgatev1.ListRecordsResponse, error) {
	switch req.GetState() {
	case "", StateInFlight, StateCompleted, StateReleased, StateUnknown:
	default:
		return nil, invalid("state", fmt.Sprintf("state %q is not in_flight, completed, released or unknown", req.GetState()))
	}
	limit := int(req.GetLimit())
	switch {
	case limit == 0:
		limit = 100
	case limit < 0 || limit > 1000:
		return nil, invalid("limit", "limit must be between 1 and 1000")
	}
	var order ListOrder
	switch req.GetOrder() {
	case idemgatev1.RecordOrder_RECORD_ORDER_UNSPECIFIED:
	case idemgatev1.RecordOrder_RECORD_ORDER_REPLAYS:
		order = OrderReplays
	case idemgatev1.RecordOrder_RECORD_ORDER_REPLAY_AGE:
		order = OrderReplayAge
	default:
		return nil, invalid("order", fmt.Sprintf("order %d is not a RecordOrder", req.GetOrder()))
	}
	q := ListQuery{State: req.GetState(), Order: order, Limit: limit + 1} // one more tells whether a next page exists
	if req.GetPageToken() != "" {
		after, err := decodePageToken(req.GetPageToken(), req.GetState(), order)
		if err != nil {
			return nil, err
		}
		q.After = &after
	}
	records, err := a.inspector.ListRecords(ctx, q)
	if err != nil {
		return nil, a.service.storeError(ctx, "ListRecords", err)
	}
	resp := &idemgatev1.ListRecordsResponse{}
	if len(records) > limit {
		records = records[:limit]
		resp.NextPageToken = encodePageToken(req.GetState(), order, PositionOf(records[limit-1]))
	}
	for _, r := range records {
		resp.Records = append(resp.Records, toProto(r))
	}
	return resp, nil
}

// pageToken is what a ListRecords page token carries: the listing's state
// filter and the last listed record's position. It is opaque to callers but
// not secret: an admin may list every record anyway.
type pageToken struct {
	State     string    `json:"s"`
	Order     ListOrder `json:"o,omitempty"`
	Unknown   bool      `json:"u,omitempty"`
	ExpiresAt int64     `json:"e"` // Unix microseconds, PostgreSQL's precision
	Replays   int64     `json:"r,omitempty"`
	ReplayAge int64     `json:"a,omitempty"` // microseconds
	Namespace string    `json:"ns,omitempty"`
	Scope     string    `json:"n"`
	Key       string    `json:"k"`
}

func encodePageToken(state string, order ListOrder, p ListPosition) string {
	raw, _ := json.Marshal(pageToken{State: state, Order: order, Unknown: p.Unknown, ExpiresAt: p.ExpiresAt.UnixMicro(), // cannot fail: strings, bools and ints
		Replays: p.ReplayCount, ReplayAge: p.ReplayAge.Microseconds(), Namespace: p.ID.Namespace, Scope: p.ID.Scope, Key: p.ID.Key})
	return base64.RawURLEncoding.EncodeToString(raw)
}

func decodePageToken(token, state string, order ListOrder) (ListPosition, error) {
	var t pageToken
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err == nil {
		err = json.Unmarshal(raw, &t)
	}
	if err != nil {
		return ListPosition{}, invalid("page_token", "page_token is not a next_page_token from ListRecords; start without one")
	}
	if t.State != state {
		return ListPosition{}, invalid("page_token", fmt.Sprintf("page_token continues a listing of state %q, not %q; pass the same state", t.State, state))
	}
	if t.Order != order {
		return ListPosition{}, invalid("page_token", "page_token continues a listing in another order; pass the same order")
	}
	return ListPosition{Unknown: t.Unknown, ExpiresAt: time.UnixMicro(t.ExpiresAt), ReplayCount: t.Replays, ReplayAge: time.Duration(t.ReplayAge) * time.Microsecond,
		ID: RecordID{Namespace: t.Namespace, Scope: t.Scope, Key: t.Key}}, nil
}

// CountRecords implements idemgatev1.AdminServiceServer.
func (a *AdminServer) CountRecords(ctx context.Context, _ *idemgatev1.CountRecordsRequest) (*idemgatev1.CountRecordsResponse, error) {
	counts, err := a.inspector.CountRecords(ctx)
	if err != nil {
		return nil, a.service.storeError(ctx, "CountRecords", err)
	}
	resp := &idemgatev1.CountRecordsResponse{}
	sortCounts(counts)
	for _, c := range counts {
		resp.Counts = append(resp.Counts, &idemgatev1.CountRecordsResponse_Count{State: c.State, Method: c.Method, Count: c.Count})
	}
	return resp, nil
}

// ResolveRecord implements idemgatev1.AdminServiceServer.
func (a *AdminServer) ResolveRecord(ctx context.Context, req *idemgatev1.ResolveRecordRequest) (*idemgatev1.ResolveRecordResponse, error) {
	id, err := storedID(req.GetRef())
	if err != nil {
		return nil, err
	}
	params := ResolveParams{Namespace: id.Namespace, Scope: id.Scope, Key: id.Key}
	switch r := req.GetResolution().(type) {
	case *idemgatev1.ResolveRecordRequest_Complete:
		outcome, err := a.service.validOutcome("complete", r.Complete)
		if err == nil {
			outcome, err = a.service.sealOutcome(id, outcome)
		}
		if err != nil {
			return nil, err
		}
		params.Complete = &outcome
	case *idemgatev1.ResolveRecordRequest_Release_:
	default:
		return nil, invalid("resolution", "resolution is required: complete with an outcome, or release")
	}
	if err := a.store.Resolve(ctx, params); err != nil {
		return nil, a.service.storeError(ctx, "ResolveRecord", err)
	}
	a.service.opts.metrics.count(outcomeResolved)
	return &idemgatev1.ResolveRecordResponse{}, nil
}

// ForgetRecord implements idemgatev1.AdminServiceServer. Every forget is
// logged as a warning naming who forgot what, and counted
// (idemgate_dedupe_records_forgotten_total).
func (a *AdminServer) ForgetRecord(ctx context.Context, req *idemgatev1.ForgetRecordRequest) (*idemgatev1.ForgetRecordResponse, error) {
	id, err := storedID(req.GetRef())
	if err != nil {
		return nil, err
	}
	if a.forgetter == nil {
		return nil, grpcerr.New(codes.Unimplemented, ReasonStoreUnsupported,
			fmt.Sprintf("this service's store (%T) cannot forget records", a.store), nil, 0)
	}
	before, err := a.forgetter.ForgetRecord(ctx, ForgetParams{ID: id, Force: req.GetForce()})
	if errors.Is(err, ErrNotSettled) {
		msg := "the record is in flight: an attempt holds the key and may be running its side effect now; forgetting it lets a duplicate run the side effect again beside it. Wait until it settles, or pass force"
		if before.State == StateUnknown {
			msg = "the record's outcome is unknown: its side effect may have happened; forgetting it lets the next call run it again. Settle it with ResolveRecord (idemctl resolve), or pass force"
		}
		return nil, grpcerr.New(codes.FailedPrecondition, ReasonRecordNotSettled, msg, map[string]string{"state": before.State}, 0)
	}
	if err != nil {
		return nil, a.service.storeError(ctx, "ForgetRecord", err)
	}
	who := "(unauthenticated)"
	if c, ok := CallerFromContext(ctx); ok {
		who = c.Name
	}
	a.service.opts.logger.WarnContext(ctx, "record forgotten by an operator: the next call with its key runs the side effect again",
		slog.String("by", who), slog.String("namespace", id.Namespace), slog.String("scope", id.Scope), slog.String("key", id.Key),
		slog.String("state", before.State), slog.Int64("epoch", before.Epoch), slog.Bool("forced", req.GetForce()))
	a.service.opts.metrics.forgot(before.State, req.GetForce())
	return &idemgatev1.ForgetRecordResponse{Record: toProto(before)}, nil
}

// GetMigrationStatus implements idemgatev1.AdminServiceServer.
func (a *AdminServer) GetMigrationStatus(ctx context.Context, _ *idemgatev1.GetMigrationStatusRequest) (*idemgatev1.GetMigrationStatusResponse, error) {
	store, migrations, err := a.inspector.MigrationStatus(ctx)
	if err != nil {
		return nil, a.service.storeError(ctx, "GetMigrationStatus", err)
	}
	resp := &idemgatev1.GetMigrationStatusResponse{Store: store}
	for _, m := range migrations {
		resp.Migrations = append(resp.Migrations, &idemgatev1.GetMigrationStatusResponse_Migration{Name: m.Name, Applied: m.Applied})
	}
	return resp, nil
}

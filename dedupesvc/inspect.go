package dedupesvc

import (
	"context"
	"sort"
	"strings"
	"time"
)

// Inspector is what the admin RPCs need from a Store beyond Store itself.
// Both stores implement it.
type Inspector interface {
	// GetRecord returns one record by its namespace, scope and key, with its
	// outcome's value (as stored: sealed when Outcome.KeyID is set).
	GetRecord(ctx context.Context, id RecordID) (StoredRecord, bool, error)
	// ListRecords lists one page of records in the query's order
	// (ListPosition), without outcome values.
	ListRecords(ctx context.Context, q ListQuery) ([]StoredRecord, error)
	// CountRecords counts records by state and method (MethodOf the scope), across namespaces and tenants, in any order.
	CountRecords(ctx context.Context) ([]MethodCount, error)
	// MigrationStatus names the store and lists its migrations.
	MigrationStatus(ctx context.Context) (store string, migrations []MigrationState, err error)
}

// StoredRecord is a record with its identity, as the admin RPCs show it.
type StoredRecord struct {
	// ID is the record's namespace, scope and key.
	ID RecordID
	// Record is the record; its Outcome.Value is left empty in listings.
	Record
	// OutcomeSize is the stored outcome's size in bytes.
	OutcomeSize int64
	// ReplayCount is how many replays of the current outcome were counted
	// (ReplayCounter): a lower bound. 0 when none, also for counts a record
	// kept from an earlier life of its key.
	ReplayCount int64
	// LastReplayedAt is when the last counted replay was served; zero when
	// none was.
	LastReplayedAt time.Time
}

// ReplayAge is how long after its completion the record was last replayed;
// 0 when it was never replayed.
func (r StoredRecord) ReplayAge() time.Duration {
	if r.ReplayCount == 0 || r.LastReplayedAt.IsZero() || r.CompletedAt.IsZero() {
		return 0
	}
	return r.LastReplayedAt.Sub(r.CompletedAt)
}

// ListOrder is the order Inspector.ListRecords lists in.
type ListOrder int

const (
	// OrderDefault lists outcome-unknown records first, then by expiry,
	// namespace, scope and key. The zero value.
	OrderDefault ListOrder = iota
	// OrderReplays lists replayed records only (ReplayCount above 0), the
	// most replayed first, then by namespace, scope and key.
	OrderReplays
	// OrderReplayAge lists replayed records only, the longest ReplayAge
	// first, then by namespace, scope and key.
	OrderReplayAge
)

// ListQuery selects one page of records for Inspector.ListRecords.
type ListQuery struct {
	// State, when not empty, lists only records in that state.
	State string
	// Order is the listing's order. Defaults to OrderDefault.
	Order ListOrder
	// Limit is the most records the page holds.
	Limit int
	// After, when set, starts the page after this position; nil starts at the
	// beginning.
	After *ListPosition
}

// ListPosition is a record's place in a listing order. OrderDefault puts
// outcome-unknown records first (they need an operator), then sorts by
// expiry, namespace, scope and key; the replay orders sort by ReplayCount
// or ReplayAge, descending, then namespace, scope and key. Each order is
// total, so a listing resumed after a position neither repeats nor skips a
// record that stayed put.
type ListPosition struct {
	// Unknown reports whether the record's outcome is unknown.
	Unknown bool
	// ExpiresAt is the record's expiry.
	ExpiresAt time.Time
	// ReplayCount is the record's replay count (OrderReplays).
	ReplayCount int64
	// ReplayAge is the record's replay age (OrderReplayAge).
	ReplayAge time.Duration
	// ID is the record's namespace, scope and key.
	ID RecordID
}

// PositionOf returns r's place in every listing order.
func PositionOf(r StoredRecord) ListPosition {
	return ListPosition{Unknown: r.State == StateUnknown, ExpiresAt: r.ExpiresAt, ReplayCount: r.ReplayCount, ReplayAge: r.ReplayAge(), ID: r.ID}
}

// MigrationState is one migration and whether the store has it.
type MigrationState struct {
	// Name is the migration's file name.
	Name string
	// Applied reports whether the store has run it.
	Applied bool
}

// MethodOf returns the full method name at the start of a scope the
// interceptor sent ("/pkg.Service/Method|tenant").
func MethodOf(scope string) string {
	method, _, _ := strings.Cut(scope, "|")
	return method
}

// MethodCount is how many records one method has in one state, across
// namespaces and tenants.
type MethodCount struct {
	// State is one of the State constants.
	State string
	// Method is the full method name.
	Method string
	// Count is the number of records.
	Count int64
}

// sortCounts sorts counts by state, then method, in byte order, whatever the
// database's collation.
func sortCounts(counts []MethodCount) {
	sort.Slice(counts, func(i, j int) bool {
		if counts[i].State != counts[j].State {
			return counts[i].State < counts[j].State
		}
		return counts[i].Method < counts[j].Method
	})
}

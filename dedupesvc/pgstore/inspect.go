package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/dedupesvc"
)

var (
	_ dedupesvc.Inspector   = (*Store)(nil)
	_ dedupesvc.UsageLister = (*Store)(nil)
)

// replayCounted is true when the row's replay columns count replays of its
// current outcome, not of an earlier one of its key (migration 007).
const replayCounted = `(replay_count > 0 AND last_replayed_at >= completed_at)`

// listColumns selects records for the admin RPCs; the outcome's size, not
// its bytes, so a listing stays small. The replay columns count only while
// replayCounted.
const listColumns = `namespace, scope, idempotency_key, state, epoch, coalesce(outcome_type_url, ''), coalesce(octet_length(outcome_value), 0),
       lease_expires_at, completed_at, expires_at,
       CASE WHEN ` + replayCounted + ` THEN replay_count ELSE 0 END,
       CASE WHEN ` + replayCounted + ` THEN last_replayed_at END`

// listRawColumns are the columns listColumns reads, for a subquery it
// reads them from.
const listRawColumns = `namespace, scope, idempotency_key, state, epoch, outcome_type_url, outcome_value,
       lease_expires_at, completed_at, expires_at, replay_count, last_replayed_at`

const listSQL = `
SELECT ` + listColumns + `
FROM idemgate_records`

// getSQL is listSQL with the outcome's bytes and key id, for GetRecord.
const getSQL = `
SELECT ` + listColumns + `, outcome_value, coalesce(outcome_key_id, '')
FROM idemgate_records
WHERE namespace = $3 AND scope = $1 AND idempotency_key = $2`

func scanRecord(row pgx.Row, extra ...any) (dedupesvc.StoredRecord, error) {
	var (
		r                           dedupesvc.StoredRecord
		completedAt, lastReplayedAt *time.Time
	)
	err := row.Scan(append([]any{&r.ID.Namespace, &r.ID.Scope, &r.ID.Key, &r.State, &r.Epoch, &r.Outcome.TypeURL, &r.OutcomeSize,
		&r.LeaseExpiresAt, &completedAt, &r.ExpiresAt, &r.ReplayCount, &lastReplayedAt}, extra...)...)
	if completedAt != nil {
		r.CompletedAt = *completedAt
	}
	if lastReplayedAt != nil {
		r.LastReplayedAt = *lastReplayedAt
	}
	return r, err
}

// GetRecord implements dedupesvc.Inspector.
func (s *Store) GetRecord(ctx context.Context, id dedupesvc.RecordID) (dedupesvc.StoredRecord, bool, error) {
	var (
		value []byte
		keyID string
	)
	r, err := scanRecord(s.pool.QueryRow(ctx, getSQL, id.Scope, id.Key, id.Namespace), &value, &keyID)
	r.Outcome.Value, r.Outcome.KeyID = value, keyID
	if r.State == dedupesvc.StateCompleted && r.Outcome.Value == nil {
		r.Outcome.Value = []byte{}
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return dedupesvc.StoredRecord{}, false, nil
	case err != nil:
		return dedupesvc.StoredRecord{}, false, fmt.Errorf("pgstore: get record: %w", err)
	}
	return r, true, nil
}

// The listings' statements: $1 state (” for any), $2 limit, $3 resume
// after the position $4 scope, $5 key, $6 namespace and the order's own
// columns from $7. Each ORDER BY is the leading columns of an index
// (migrations 001, 002, 007), and the row comparison resumes in it.
const (
	// listDefaultSQL lists outcome-unknown records first, then the others,
	// each by expiry: two branches, each read in the order of its own index
	// (002's partial one of unknown records, 001's of expires_at; the
	// planner sorts the ties of one expires_at by the rest), stopped at the
	// limit, then the at most twice limit rows merged. One ORDER BY
	// beginning with state <> 'unknown' matches no index: it sorted the
	// whole table for each page (300 to 800 ms with a million records,
	// 1 to 3 ms this way). $7 is true when the position resumed after is
	// not outcome-unknown: the unknown branch is then done.
	listDefaultSQL = `
SELECT ` + listColumns + `
FROM ((SELECT ` + listRawColumns + ` FROM idemgate_records
       WHERE state = 'unknown' AND ($1 = '' OR $1 = 'unknown')
         AND (NOT $3 OR (NOT $7::boolean AND (expires_at, namespace, scope, idempotency_key) > ($8::timestamptz, $6::text, $4::text, $5::text)))
       ORDER BY expires_at, namespace, scope, idempotency_key
       LIMIT $2)
      UNION ALL
      (SELECT ` + listRawColumns + ` FROM idemgate_records
       WHERE state <> 'unknown' AND ($1 = '' OR state = $1)
         AND (NOT $3 OR NOT $7::boolean OR (expires_at, namespace, scope, idempotency_key) > ($8::timestamptz, $6::text, $4::text, $5::text))
       ORDER BY expires_at, namespace, scope, idempotency_key
       LIMIT $2)) AS idemgate_records
ORDER BY state <> 'unknown', expires_at, namespace, scope, idempotency_key
LIMIT $2`
	// -replay_count sorts the most replayed first in an ascending index.
	listReplaysSQL = listSQL + `
WHERE replay_count > 0 AND last_replayed_at >= completed_at AND ($1 = '' OR state = $1)
  AND (NOT $3 OR (-replay_count, namespace, scope, idempotency_key) > ($7::bigint, $6::text, $4::text, $5::text))
ORDER BY -replay_count, namespace, scope, idempotency_key
LIMIT $2`
	// completed_at - last_replayed_at is minus the replay age: the longest
	// first in an ascending index.
	listReplayAgeSQL = listSQL + `
WHERE replay_count > 0 AND last_replayed_at >= completed_at AND ($1 = '' OR state = $1)
  AND (NOT $3 OR (completed_at - last_replayed_at, namespace, scope, idempotency_key) > ($7::interval, $6::text, $4::text, $5::text))
ORDER BY completed_at - last_replayed_at, namespace, scope, idempotency_key
LIMIT $2`
)

// ListRecords implements dedupesvc.Inspector.
func (s *Store) ListRecords(ctx context.Context, q dedupesvc.ListQuery) ([]dedupesvc.StoredRecord, error) {
	var after dedupesvc.ListPosition
	if q.After != nil {
		after = *q.After
	}
	var (
		query string
		args  = []any{q.State, q.Limit, q.After != nil, after.ID.Scope, after.ID.Key, after.ID.Namespace}
	)
	switch q.Order {
	case dedupesvc.OrderReplays:
		query, args = listReplaysSQL, append(args, -after.ReplayCount)
	case dedupesvc.OrderReplayAge:
		query, args = listReplayAgeSQL, append(args, -after.ReplayAge)
	default:
		query, args = listDefaultSQL, append(args, !after.Unknown, after.ExpiresAt)
	}
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list records: %w", err)
	}
	defer rows.Close()
	var out []dedupesvc.StoredRecord
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("pgstore: list records: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// countSQL takes the method out of a scope as dedupesvc.MethodOf does: the
// part before the first '|'.
const countSQL = `
SELECT state, split_part(scope, '|', 1), count(*)
FROM idemgate_records
GROUP BY 1, 2`

// CountRecords implements dedupesvc.Inspector.
// It groups in the database, so the answer is one row per state and method
// however many tenants and callers there are.
func (s *Store) CountRecords(ctx context.Context) ([]dedupesvc.MethodCount, error) {
	rows, err := s.pool.Query(ctx, countSQL)
	if err != nil {
		return nil, fmt.Errorf("pgstore: count records: %w", err)
	}
	var c dedupesvc.MethodCount
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (dedupesvc.MethodCount, error) {
		err := row.Scan(&c.State, &c.Method, &c.Count)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: count records: %w", err)
	}
	return out, nil
}

// MigrationStatus implements dedupesvc.Inspector.
func (s *Store) MigrationStatus(ctx context.Context) (string, []dedupesvc.MigrationState, error) {
	status, err := Status(ctx, s.pool)
	if err != nil {
		return "", nil, err
	}
	out := make([]dedupesvc.MigrationState, len(status))
	for i, m := range status {
		out[i] = dedupesvc.MigrationState{Name: m.Name, Applied: m.Applied}
	}
	return "postgres", out, nil
}

// listUsageSQL sums each namespace's usage rows (namespaceUsage: its
// compacted totals and the changes since) a page of namespaces at a time.
// The changes are about one compaction interval's worth, the totals a row
// per namespace: the namespaces are the service's callers, tens, not the
// records.
const listUsageSQL = `
SELECT namespace, sum(records)::bigint, sum(outcome_bytes)::bigint
FROM (SELECT namespace, records, outcome_bytes FROM idemgate_namespace_usage WHERE namespace > $1 OR $1 = ''
      UNION ALL
      SELECT namespace, records, outcome_bytes FROM idemgate_usage_changes WHERE namespace > $1 OR $1 = '') AS u
GROUP BY namespace
HAVING sum(records) <> 0 OR sum(outcome_bytes) <> 0
ORDER BY namespace
LIMIT $2`

// ListNamespaceUsage implements dedupesvc.UsageLister.
func (s *Store) ListNamespaceUsage(ctx context.Context, after string, limit int) ([]dedupesvc.NamespaceUsage, error) {
	rows, err := s.pool.Query(ctx, s.q(listUsageSQL), after, limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list usage: %w", err)
	}
	var u dedupesvc.NamespaceUsage
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (dedupesvc.NamespaceUsage, error) {
		err := row.Scan(&u.Namespace, &u.Records, &u.OutcomeBytes)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: list usage: %w", err)
	}
	return out, nil
}

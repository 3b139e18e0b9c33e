package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/dedupesvc"
)

var _ dedupesvc.Inspector = (*Store)(nil)

// listSQL selects records for the admin RPCs; the outcome's size, not its
// bytes, so a listing stays small.
const listSQL = `
SELECT namespace, scope, idempotency_key, state, epoch, coalesce(outcome_type_url, ''), coalesce(octet_length(outcome_value), 0),
       lease_expires_at, completed_at, expires_at
FROM idemgate_records`

func scanRecord(row pgx.Row) (dedupesvc.StoredRecord, error) {
	var (
		r           dedupesvc.StoredRecord
		completedAt *time.Time
	)
	err := row.Scan(&r.ID.Namespace, &r.ID.Scope, &r.ID.Key, &r.State, &r.Epoch, &r.Outcome.TypeURL, &r.OutcomeSize,
		&r.LeaseExpiresAt, &completedAt, &r.ExpiresAt)
	if completedAt != nil {
		r.CompletedAt = *completedAt
	}
	return r, err
}

// GetRecord implements dedupesvc.Inspector.
func (s *Store) GetRecord(ctx context.Context, id dedupesvc.RecordID) (dedupesvc.StoredRecord, bool, error) {
	r, err := scanRecord(s.pool.QueryRow(ctx, listSQL+` WHERE namespace = $3 AND scope = $1 AND idempotency_key = $2`, id.Scope, id.Key, id.Namespace))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return dedupesvc.StoredRecord{}, false, nil
	case err != nil:
		return dedupesvc.StoredRecord{}, false, fmt.Errorf("pgstore: get record: %w", err)
	}
	return r, true, nil
}

// ListRecords implements dedupesvc.Inspector.
func (s *Store) ListRecords(ctx context.Context, q dedupesvc.ListQuery) ([]dedupesvc.StoredRecord, error) {
	var after dedupesvc.ListPosition
	if q.After != nil {
		after = *q.After
	}
	rows, err := s.pool.Query(ctx, listSQL+`
WHERE ($1 = '' OR state = $1)
  AND (NOT $3 OR (state <> 'unknown', expires_at, namespace, scope, idempotency_key) > ($4::boolean, $5::timestamptz, $8::text, $6::text, $7::text))
ORDER BY state <> 'unknown', expires_at, namespace, scope, idempotency_key
LIMIT $2`, q.State, q.Limit, q.After != nil, !after.Unknown, after.ExpiresAt, after.ID.Scope, after.ID.Key, after.ID.Namespace)
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

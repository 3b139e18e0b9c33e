package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/migrations"
)

var _ dedupesvc.Inspector = (*Store)(nil)

// replayCounted is true when the row's replay columns count replays of its
// current outcome, not of an earlier one of its key (migration 006; see
// postgres/007_replay_counts.sql).
const replayCounted = `(replay_count > 0 AND last_replayed_at >= completed_at)`

// listColumns are the columns the admin RPCs show: the outcome's size, not
// its bytes, so a listing stays small.
const listColumns = `namespace, scope, idempotency_key, state, epoch, coalesce(outcome_type_url, ''), coalesce(length(outcome_value), 0),
       lease_expires_at, completed_at, expires_at,
       CASE WHEN ` + replayCounted + ` THEN replay_count ELSE 0 END,
       CASE WHEN ` + replayCounted + ` THEN last_replayed_at END`

const listSQL = `
SELECT ` + listColumns + `
FROM idemgate_records`

type scanner interface{ Scan(dest ...any) error }

func scanRecord(row scanner, extra ...any) (dedupesvc.StoredRecord, error) {
	var (
		r                           dedupesvc.StoredRecord
		completedAt, lastReplayedAt sql.NullInt64
		leaseExpiresAt, expiresAt   int64
	)
	err := row.Scan(append([]any{&r.ID.Namespace, &r.ID.Scope, &r.ID.Key, &r.State, &r.Epoch, &r.Outcome.TypeURL, &r.OutcomeSize,
		&leaseExpiresAt, &completedAt, &expiresAt, &r.ReplayCount, &lastReplayedAt}, extra...)...)
	r.LeaseExpiresAt, r.ExpiresAt = time.UnixMilli(leaseExpiresAt), time.UnixMilli(expiresAt)
	if completedAt.Valid {
		r.CompletedAt = time.UnixMilli(completedAt.Int64)
	}
	if lastReplayedAt.Valid {
		r.LastReplayedAt = time.UnixMilli(lastReplayedAt.Int64)
	}
	return r, err
}

// GetRecord implements dedupesvc.Inspector.
func (s *Store) GetRecord(ctx context.Context, id dedupesvc.RecordID) (dedupesvc.StoredRecord, bool, error) {
	var (
		value []byte
		keyID string
	)
	r, err := scanRecord(s.db.QueryRowContext(ctx, `SELECT `+listColumns+`, outcome_value, coalesce(outcome_key_id, '')
FROM idemgate_records WHERE namespace = ? AND scope = ? AND idempotency_key = ?`, id.Namespace, id.Scope, id.Key), &value, &keyID)
	r.Outcome.Value, r.Outcome.KeyID = value, keyID
	if r.State == dedupesvc.StateCompleted && r.Outcome.Value == nil {
		r.Outcome.Value = []byte{}
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return dedupesvc.StoredRecord{}, false, nil
	case err != nil:
		return dedupesvc.StoredRecord{}, false, fmt.Errorf("sqlitestore: get record: %w", err)
	}
	return r, true, nil
}

// The listings' statements; each ORDER BY is the leading columns of an
// index (migrations 001, 006), and the row comparison resumes in it.
const (
	listDefaultSQL = listSQL + `
WHERE (:state = '' OR state = :state)
  AND (NOT :resume OR (state <> 'unknown', expires_at, namespace, scope, idempotency_key) > (:known, :expires_at, :ns, :scope, :key))
ORDER BY state <> 'unknown', expires_at, namespace, scope, idempotency_key
LIMIT :limit`
	listReplaysSQL = listSQL + `
WHERE replay_count > 0 AND last_replayed_at >= completed_at AND (:state = '' OR state = :state)
  AND (NOT :resume OR (-replay_count, namespace, scope, idempotency_key) > (:neg_replays, :ns, :scope, :key))
ORDER BY -replay_count, namespace, scope, idempotency_key
LIMIT :limit`
	listReplayAgeSQL = listSQL + `
WHERE replay_count > 0 AND last_replayed_at >= completed_at AND (:state = '' OR state = :state)
  AND (NOT :resume OR (completed_at - last_replayed_at, namespace, scope, idempotency_key) > (:neg_age, :ns, :scope, :key))
ORDER BY completed_at - last_replayed_at, namespace, scope, idempotency_key
LIMIT :limit`
)

// ListRecords implements dedupesvc.Inspector.
func (s *Store) ListRecords(ctx context.Context, q dedupesvc.ListQuery) ([]dedupesvc.StoredRecord, error) {
	var after dedupesvc.ListPosition
	if q.After != nil {
		after = *q.After
	}
	query := listDefaultSQL
	switch q.Order {
	case dedupesvc.OrderReplays:
		query = listReplaysSQL
	case dedupesvc.OrderReplayAge:
		query = listReplayAgeSQL
	}
	rows, err := s.db.QueryContext(ctx, query, sql.Named("state", q.State), sql.Named("limit", q.Limit), sql.Named("resume", q.After != nil),
		sql.Named("known", !after.Unknown), sql.Named("expires_at", after.ExpiresAt.UnixMilli()),
		sql.Named("neg_replays", -after.ReplayCount), sql.Named("neg_age", -after.ReplayAge.Milliseconds()),
		sql.Named("ns", after.ID.Namespace), sql.Named("scope", after.ID.Scope), sql.Named("key", after.ID.Key))
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: list records: %w", err)
	}
	defer rows.Close()
	var out []dedupesvc.StoredRecord
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("sqlitestore: list records: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// countSQL takes the method out of a scope as dedupesvc.MethodOf does: the
// part before the first '|'.
const countSQL = `
SELECT state, CASE WHEN instr(scope, '|') > 0 THEN substr(scope, 1, instr(scope, '|') - 1) ELSE scope END, count(*)
FROM idemgate_records
GROUP BY 1, 2`

// CountRecords implements dedupesvc.Inspector. It groups in the database,
// so the answer is one row per state and method however many tenants and
// callers there are.
func (s *Store) CountRecords(ctx context.Context) ([]dedupesvc.MethodCount, error) {
	rows, err := s.db.QueryContext(ctx, countSQL)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: count records: %w", err)
	}
	defer rows.Close()
	var out []dedupesvc.MethodCount
	for rows.Next() {
		var c dedupesvc.MethodCount
		if err := rows.Scan(&c.State, &c.Method, &c.Count); err != nil {
			return nil, fmt.Errorf("sqlitestore: count records: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// MigrationStatus implements dedupesvc.Inspector.
func (s *Store) MigrationStatus(ctx context.Context) (string, []dedupesvc.MigrationState, error) {
	all, err := migrations.List(migrations.SQLite, "sqlite")
	if err != nil {
		return "", nil, err
	}
	out := make([]dedupesvc.MigrationState, len(all))
	for i, m := range all {
		var one int
		err := s.db.QueryRowContext(ctx, `SELECT 1 FROM idemgate_schema_migrations WHERE version = ?`, m.Version).Scan(&one)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return "", nil, err
		}
		out[i] = dedupesvc.MigrationState{Name: m.Name, Applied: err == nil}
	}
	return "sqlite", out, nil
}

var _ dedupesvc.UsageLister = (*Store)(nil)

// listUsageSQL reads the usage totals the triggers keep exact (migration
// 004), a page of namespaces at a time.
const listUsageSQL = `
SELECT namespace, records, outcome_bytes FROM idemgate_namespace_usage
WHERE (namespace > ?1 OR ?1 = '') AND (records <> 0 OR outcome_bytes <> 0)
ORDER BY namespace
LIMIT ?2`

// ListNamespaceUsage implements dedupesvc.UsageLister.
func (s *Store) ListNamespaceUsage(ctx context.Context, after string, limit int) ([]dedupesvc.NamespaceUsage, error) {
	rows, err := s.db.QueryContext(ctx, listUsageSQL, after, limit)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: list usage: %w", err)
	}
	defer rows.Close()
	var out []dedupesvc.NamespaceUsage
	for rows.Next() {
		var u dedupesvc.NamespaceUsage
		if err := rows.Scan(&u.Namespace, &u.Records, &u.OutcomeBytes); err != nil {
			return nil, fmt.Errorf("sqlitestore: list usage: %w", err)
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlitestore: list usage: %w", err)
	}
	return out, nil
}

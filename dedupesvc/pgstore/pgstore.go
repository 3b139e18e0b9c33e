// Package pgstore is the PostgreSQL implementation of dedupesvc.Store, on
// pgx/v5 and pgxpool.
//
// Every state change is one statement in its own implicit transaction under
// READ COMMITTED; the reservation commits before the tool's handler runs and
// no row lock outlives a statement. The SQL avoids advisory locks and other
// PostgreSQL-only features, so the same schema runs on CockroachDB and
// YugabyteDB.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc"
)

// Store is a dedupesvc.Store on a PostgreSQL connection pool. The schema must
// be migrated first (Migrate).
type Store struct {
	pool *pgxpool.Pool
}

var _ dedupesvc.Store = (*Store)(nil)

// New returns a Store on pool. The caller owns the pool and closes it.
func New(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool}
}

// maxBeginRounds bounds the loop between the reserving upsert and the read of
// the row that blocked it: the row can change between the two (it expires, is
// released or is swept), which needs one more round, never many.
const maxBeginRounds = 4

// reserveSQL takes the key when it is free: no row, or a row that expired, or
// a row with the same fingerprint that was released or whose lease ran out.
// It returns nothing when another row blocks it. It repeats the conditions
// decide checked, because only this statement's view of the row is atomic.
const reserveSQL = `
INSERT INTO idemgate_records AS r (
    scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    retention_ms, lease_expires_at, expires_at)
VALUES (
    $1, $2, $3, 'in_flight', $4, 1,
    $6::bigint, now() + $5::bigint * interval '1 millisecond', now() + $6::bigint * interval '1 millisecond')
ON CONFLICT (scope, idempotency_key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    state = 'in_flight',
    attempt_token = excluded.attempt_token,
    epoch = r.epoch + 1,
    retention_ms = excluded.retention_ms,
    outcome_type_url = NULL,
    outcome_value = NULL,
    lease_expires_at = excluded.lease_expires_at,
    expires_at = excluded.expires_at,
    created_at = now(),
    completed_at = NULL
WHERE r.expires_at <= now()
   OR (r.fingerprint = excluded.fingerprint
       AND (r.state = 'released'
            OR (r.state = 'in_flight' AND r.lease_expires_at <= now()
                AND r.attempt_token <> excluded.attempt_token)))
RETURNING epoch, lease_expires_at`

// readSQL reads a key's row with the database's clock, so expiry is judged by
// one clock across every dedupe service replica.
const readSQL = `
SELECT fingerprint, state, attempt_token, epoch, outcome_type_url, outcome_value,
       lease_expires_at, completed_at, expires_at, now()
FROM idemgate_records
WHERE scope = $1 AND idempotency_key = $2`

// Begin implements dedupesvc.Store. It reads first, so a duplicate (a replay,
// an in-flight or mismatched key) costs one read and no commit; only when the
// read finds the key free does it write, and then the single upsert decides
// who holds it.
func (s *Store) Begin(ctx context.Context, p dedupesvc.BeginParams) (dedupesvc.BeginResult, error) {
	for range maxBeginRounds {
		row, found, err := s.read(ctx, p.Scope, p.Key)
		if err != nil {
			return dedupesvc.BeginResult{}, err
		}
		if found {
			if res, decided := row.decide(p); decided {
				return res, nil
			}
		}
		var res dedupesvc.BeginResult
		err = s.pool.QueryRow(ctx, reserveSQL,
			p.Scope, p.Key, p.Fingerprint, p.AttemptToken, p.Lease.Milliseconds(), p.Retention.Milliseconds(),
		).Scan(&res.Epoch, &res.LeaseExpiresAt)
		switch {
		case err == nil:
			res.State = dedupesvc.BeginReserved
			return res, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return dedupesvc.BeginResult{}, fmt.Errorf("pgstore: reserve: %w", err)
		}
		// Another attempt reserved the key between the read and the upsert:
		// read again to learn what it holds.
	}
	return dedupesvc.BeginResult{}, fmt.Errorf("pgstore: the record of the key kept changing over %d rounds", maxBeginRounds)
}

func (s *Store) read(ctx context.Context, scope, key string) (record, bool, error) {
	var (
		row     record
		typeURL *string
	)
	err := s.pool.QueryRow(ctx, readSQL, scope, key).Scan(
		&row.fingerprint, &row.state, &row.attemptToken, &row.epoch, &typeURL, &row.outcomeValue,
		&row.leaseExpiresAt, &row.completedAt, &row.expiresAt, &row.now)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return record{}, false, nil
	case err != nil:
		return record{}, false, fmt.Errorf("pgstore: read record: %w", err)
	}
	if typeURL != nil {
		row.outcomeTypeURL = *typeURL
	}
	return row, true, nil
}

// record is one row as read by readSQL.
type record struct {
	fingerprint    []byte
	state          string
	attemptToken   string
	epoch          int64
	outcomeTypeURL string
	outcomeValue   []byte
	leaseExpiresAt time.Time
	completedAt    *time.Time
	expiresAt      time.Time
	// now is the database's clock when the row was read.
	now time.Time
}

// decide turns an existing row into Begin's answer. It reports false when the
// row does not block a reservation (expired, released, or abandoned with the
// same request), so the caller tries to reserve.
func (r record) decide(p dedupesvc.BeginParams) (dedupesvc.BeginResult, bool) {
	now := r.now
	if !r.expiresAt.After(now) {
		return dedupesvc.BeginResult{}, false
	}
	if string(r.fingerprint) != string(p.Fingerprint) {
		return dedupesvc.BeginResult{State: dedupesvc.BeginFingerprintMismatch}, true
	}
	switch r.state {
	case "completed":
		res := dedupesvc.BeginResult{
			State:     dedupesvc.BeginCompleted,
			Outcome:   dedupesvc.Outcome{TypeURL: r.outcomeTypeURL, Value: r.outcomeValue},
			ExpiresAt: r.expiresAt,
		}
		if r.completedAt != nil {
			res.CompletedAt = *r.completedAt
		}
		return res, true
	case "in_flight":
		if r.attemptToken == p.AttemptToken {
			// The same attempt asks again because it lost our first answer.
			return dedupesvc.BeginResult{State: dedupesvc.BeginReserved, Epoch: r.epoch, LeaseExpiresAt: r.leaseExpiresAt}, true
		}
		if !r.leaseExpiresAt.After(now) {
			return dedupesvc.BeginResult{}, false
		}
		return dedupesvc.BeginResult{State: dedupesvc.BeginInFlight, LeaseExpiresAt: r.leaseExpiresAt}, true
	default: // released
		return dedupesvc.BeginResult{}, false
	}
}

// finishSQL stores the outcome if the attempt still holds the reservation,
// and restarts the retention from now.
const finishSQL = `
UPDATE idemgate_records
SET state = 'completed',
    outcome_type_url = $5,
    outcome_value = $6,
    completed_at = now(),
    expires_at = now() + retention_ms * interval '1 millisecond'
WHERE scope = $1 AND idempotency_key = $2 AND attempt_token = $3 AND epoch = $4
  AND state = 'in_flight'`

// holderSQL tells a refused Finish or Release whether it is a retry of one
// that already took effect.
const holderSQL = `
SELECT state, attempt_token = $3 AND epoch = $4
FROM idemgate_records
WHERE scope = $1 AND idempotency_key = $2`

// Finish implements dedupesvc.Store.
func (s *Store) Finish(ctx context.Context, p dedupesvc.FinishParams) error {
	tag, err := s.pool.Exec(ctx, finishSQL, p.Scope, p.Key, p.AttemptToken, p.Epoch, p.Outcome.TypeURL, p.Outcome.Value)
	if err != nil {
		return fmt.Errorf("pgstore: finish: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	state, mine, err := s.holder(ctx, p.Scope, p.Key, p.AttemptToken, p.Epoch)
	if errors.Is(err, errNoRecord) {
		return dedupesvc.ErrNotHeld // expired and swept before the outcome came
	}
	if err != nil {
		return err
	}
	if mine && state == "completed" {
		return nil // a retried Finish: the stored outcome stays as it was
	}
	return dedupesvc.ErrNotHeld
}

// releaseSQL frees the reservation if the attempt still holds it.
const releaseSQL = `
UPDATE idemgate_records
SET state = 'released', lease_expires_at = now()
WHERE scope = $1 AND idempotency_key = $2 AND attempt_token = $3 AND epoch = $4
  AND state = 'in_flight'`

// Release implements dedupesvc.Store.
func (s *Store) Release(ctx context.Context, p dedupesvc.ReleaseParams) error {
	tag, err := s.pool.Exec(ctx, releaseSQL, p.Scope, p.Key, p.AttemptToken, p.Epoch)
	if err != nil {
		return fmt.Errorf("pgstore: release: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	state, mine, err := s.holder(ctx, p.Scope, p.Key, p.AttemptToken, p.Epoch)
	if errors.Is(err, errNoRecord) {
		return nil // expired and swept: nothing is held
	}
	if err != nil {
		return err
	}
	if mine && state == "released" {
		return nil // a retried Release
	}
	return dedupesvc.ErrNotHeld
}

var errNoRecord = errors.New("pgstore: no record")

func (s *Store) holder(ctx context.Context, scope, key, token string, epoch int64) (state string, mine bool, err error) {
	err = s.pool.QueryRow(ctx, holderSQL, scope, key, token, epoch).Scan(&state, &mine)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", false, errNoRecord
	case err != nil:
		return "", false, fmt.Errorf("pgstore: read holder: %w", err)
	}
	return state, mine, nil
}

// deleteExpiredSQL deletes one bounded batch of expired rows, oldest first,
// through the expires_at index. The outer expiry test re-checks each row, so
// a row reserved anew between the two scans survives.
const deleteExpiredSQL = `
DELETE FROM idemgate_records
WHERE (scope, idempotency_key) IN (
    SELECT scope, idempotency_key FROM idemgate_records
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT $1)
  AND expires_at <= now()`

// DeleteExpired implements dedupesvc.Store.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, error) {
	tag, err := s.pool.Exec(ctx, deleteExpiredSQL, limit)
	if err != nil {
		return 0, fmt.Errorf("pgstore: delete expired: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

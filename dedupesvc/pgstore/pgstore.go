// Package pgstore is the PostgreSQL implementation of dedupesvc.Store, on
// pgx/v5 and pgxpool.
//
// Every state change is one statement in its own implicit transaction under
// READ COMMITTED; the reservation commits before the tool's handler runs and
// no row lock outlives a statement. The SQL avoids advisory locks; it uses
// two PostgreSQL-only features: NOTIFY to wake waiting duplicates, a hint
// that can be turned off (WithoutNotify), leaving waiters to poll; and
// pg_postmaster_start_time(), so a database restart never counts against a
// live holder's lease.
package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc"
)

// DefaultChannel is the NOTIFY channel record changes are announced on.
const DefaultChannel = "idemgate_records"

// Store is a dedupesvc.Store on a PostgreSQL connection pool. The schema must
// be migrated first (Migrate).
type Store struct {
	pool    *pgxpool.Pool
	channel string // "" when notifications are off
	// finishSQL, releaseSQL, resolveCompleteSQL, resolveReleaseSQL and
	// markUnknownSQL change a record's state; with notifications on they also
	// announce the change, in the same statement.
	finishSQL, releaseSQL, releaseUnknownSQL, resolveCompleteSQL, resolveReleaseSQL, markUnknownSQL string
	// cutOff is set when a statement failed because the database could not
	// be reached; the next operation marks the store resumed first (see
	// resume).
	cutOff atomic.Bool
}

var (
	_ dedupesvc.Store   = (*Store)(nil)
	_ dedupesvc.Resumer = (*Store)(nil)
)

// Option configures New.
type Option func(*Store)

// WithChannel sets the NOTIFY channel that state changes are announced on.
// Defaults to DefaultChannel.
func WithChannel(channel string) Option {
	return func(s *Store) { s.channel = channel }
}

// WithoutNotify stops announcing state changes, for databases without
// LISTEN/NOTIFY (CockroachDB); waiting duplicates then poll. Defaults to
// announcing.
func WithoutNotify() Option {
	return func(s *Store) { s.channel = "" }
}

// New returns a Store on pool. The caller owns the pool and closes it.
func New(pool *pgxpool.Pool, opts ...Option) *Store {
	s := &Store{pool: pool, channel: DefaultChannel}
	for _, opt := range opts {
		opt(s)
	}
	s.finishSQL = s.announced(finishSQL, 9)
	s.releaseSQL = s.announced(releaseSQL, 6)
	s.releaseUnknownSQL = s.announced(releaseUnknownSQL, 7)
	s.resolveCompleteSQL = s.announced(resolveCompleteSQL, 7)
	s.resolveReleaseSQL = s.announced(resolveReleaseSQL, 4)
	s.markUnknownSQL = s.announced(markUnknownSQL, 6)
	return s
}

// Pool returns the connection pool the Store runs on.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Channel returns the NOTIFY channel state changes are announced on, ""
// when notifications are off.
func (s *Store) Channel() string { return s.channel }

// announced wraps a state-changing UPDATE so that, when notifications are on
// and a duplicate waits for the record (its waiters flag is set), the same
// statement also sends a NOTIFY, delivered when it commits. The channel and
// the record's notify ID become parameters $next and $next+1. It answers
// how many rows changed.
func (s *Store) announced(update string, next int) string {
	if s.channel == "" {
		return fmt.Sprintf("WITH changed AS (%s\nRETURNING 1)\nSELECT count(*) FROM changed", update)
	}
	return fmt.Sprintf(`WITH changed AS (%s
RETURNING waiters),
notified AS (SELECT pg_notify($%d, $%d) FROM changed WHERE waiters)
SELECT (SELECT count(*) FROM changed) + 0 * (SELECT count(*) FROM notified)`, update, next, next+1)
}

// change runs one of the announced statements and reports how many rows it
// changed.
func (s *Store) change(ctx context.Context, sql string, id dedupesvc.RecordID, args ...any) (int, error) {
	if s.channel != "" {
		args = append(args, s.channel, NotifyID(id))
	}
	var n int
	err := s.pool.QueryRow(ctx, sql, args...).Scan(&n)
	return n, s.noted(ctx, err)
}

// markResumedSQL moves the resume time to now, never back (a database clock
// stepped back keeps the later grace). It recreates the row if someone
// deleted it.
const markResumedSQL = `
INSERT INTO idemgate_store_state AS st (id, resumed_at) VALUES (true, now())
ON CONFLICT (id) DO UPDATE SET resumed_at = greatest(st.resumed_at, excluded.resumed_at)`

// MarkResumed implements dedupesvc.Resumer: from now on every in-flight
// record's lease runs until at least one full lease (its lease_ms) past now,
// by the database's clock, for every replica on this database. Call it when
// a Dedupe service process starts, after Migrate; the store also calls it
// itself after it could not reach the database (see resume).
func (s *Store) MarkResumed(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, markResumedSQL); err != nil {
		return fmt.Errorf("pgstore: mark resumed: %w", s.noted(ctx, err))
	}
	return nil
}

// resume marks the store resumed, once, before the first operation after a
// statement failed because the database could not be reached: this replica
// saw an outage, during which holders could not renew their leases. It runs
// before the operation's own statements, so a Begin or Resolve never decides
// on a lease that ran out during the outage. Another failure meanwhile sets
// the flag again and the next operation marks again.
func (s *Store) resume(ctx context.Context) error {
	if !s.cutOff.Swap(false) {
		return nil
	}
	if err := s.MarkResumed(ctx); err != nil {
		s.cutOff.Store(true)
		return err
	}
	return nil
}

// noted returns err, first setting the cut-off flag when err says the
// database could not be reached.
func (s *Store) noted(ctx context.Context, err error) error {
	if err != nil && unreachable(ctx, err) {
		s.cutOff.Store(true)
	}
	return err
}

// unreachable reports whether err means the database could not be reached or
// went away (connection refused or reset, server shut down, network
// timeout), as opposed to a statement the database refused. A caller that
// gave up (its context ended) proves nothing about the database, and an
// ordinary SQL error means the database answered: neither counts, since
// every mark grants every in-flight lease one more full lease.
func unreachable(ctx context.Context, err error) bool {
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Class 08 is connection exception; 57P01-03 are admin shutdown,
		// crash shutdown and cannot connect now (starting or recovering).
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"
	}
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return false
	}
	var netErr net.Error
	return pgconn.Timeout(err) || errors.As(err, &netErr) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// leaseEnd is the effective end of the lease of the row aliased t: its own
// end, or one full lease (lease_ms) past the last resume of the store
// (MarkResumed) or past the database server's start, whichever is latest.
// So neither an outage a replica noticed nor a database restart counts
// against a holder that could not renew meanwhile. Every statement that
// treats a lease as run out uses it; the one-row table makes it a scalar
// subquery on one page.
func leaseEnd(t string) string {
	return fmt.Sprintf(`greatest(%[1]s.lease_expires_at,
        (SELECT resumed_at FROM idemgate_store_state) + %[1]s.lease_ms * interval '1 millisecond',
        pg_postmaster_start_time() + %[1]s.lease_ms * interval '1 millisecond')`, t)
}

// NotifyID is the NOTIFY payload that names a record: a hash, so a payload
// stays short and never carries a tenant's key in clear.
func NotifyID(id dedupesvc.RecordID) string {
	h := sha256.New()
	// NUL never occurs in a namespace or scope (the service refuses control
	// characters), so the parts cannot run together.
	h.Write([]byte(id.Namespace))
	h.Write([]byte{0})
	h.Write([]byte(id.Scope))
	h.Write([]byte{0})
	h.Write([]byte(id.Key))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// readSQL reads a key's row with the database's clock, so expiry is judged by
// one clock across every dedupe service replica. An in-flight row's lease
// end is the effective one (leaseEnd), and so is its expiry when that is
// later (inFlightLive).
var readSQL = `
SELECT fingerprint, state, attempt_token, epoch, outcome_type_url, outcome_value, outcome_key_id,
       CASE WHEN state = 'in_flight' THEN ` + leaseEnd("r") + ` ELSE lease_expires_at END,
       completed_at,
       CASE WHEN state = 'in_flight' THEN greatest(expires_at, ` + leaseEnd("r") + `) ELSE expires_at END,
       now()
FROM idemgate_records AS r
WHERE namespace = $3 AND scope = $1 AND idempotency_key = $2`

// inFlightLive is true for an in-flight row of alias t whose effective lease
// still runs: such a row does not expire, even past its expires_at (a
// retention as short as the lease runs out with it during an outage).
func inFlightLive(t string) string {
	return fmt.Sprintf(`(%[1]s.state = 'in_flight' AND %[2]s > now())`, t, leaseEnd(t))
}

// reserveSQL takes the key when it is free: no row, or a row that expired, or
// a row with the same fingerprint that was released or (under REEXECUTE,
// $7) whose holder's lease ran out. It returns nothing when the row blocks
// it. It repeats what decide checked, because only this statement's view of
// the row is atomic, with the effective lease end (leaseEnd).
var reserveSQL = `
INSERT INTO idemgate_records AS r (
    namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    retention_ms, lease_ms, lease_expires_at, expires_at)
VALUES (
    $8, $1, $2, $3, 'in_flight', $4, 1,
    $6::bigint, $5::bigint, now() + $5::bigint * interval '1 millisecond', now() + $6::bigint * interval '1 millisecond')
ON CONFLICT (namespace, scope, idempotency_key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    state = 'in_flight',
    attempt_token = excluded.attempt_token,
    epoch = r.epoch + 1,
    retention_ms = excluded.retention_ms,
    lease_ms = excluded.lease_ms,
    outcome_type_url = NULL,
    outcome_value = NULL,
    outcome_key_id = NULL,
    lease_expires_at = excluded.lease_expires_at,
    expires_at = excluded.expires_at,
    created_at = now(),
    completed_at = NULL,
    waiters = false
WHERE (r.expires_at <= now() AND NOT ` + inFlightLive("r") + `)
   OR (r.fingerprint = excluded.fingerprint
       AND (r.state = 'released'
            OR ($7::boolean AND r.state = 'in_flight' AND ` + leaseEnd("r") + ` <= now()
                AND r.attempt_token <> excluded.attempt_token)))
RETURNING epoch, lease_expires_at`

// markUnknownSQL turns an in-flight row whose lease ran out into an
// outcome-unknown one (FAIL_CLOSED), kept for the unknown retention so it is
// not swept before someone resolves it. The epoch test makes it a no-op when
// the holder renewed its lease or finished meanwhile; the effective lease end
// (leaseEnd) makes it one while the store's resume grace runs.
var markUnknownSQL = `
UPDATE idemgate_records AS r
SET state = 'unknown',
    expires_at = greatest(expires_at, now() + $4::bigint * interval '1 millisecond')
WHERE namespace = $5 AND scope = $1 AND idempotency_key = $2 AND epoch = $3
  AND state = 'in_flight' AND ` + leaseEnd("r") + ` <= now()`

// usageSQL sums a namespace's usage rows, kept by triggers (migration 005):
// an index range of at most 16 rows, however many records it holds.
const usageSQL = `
SELECT coalesce(sum(records), 0)::bigint, coalesce(sum(outcome_bytes), 0)::bigint
FROM idemgate_namespace_usage WHERE namespace = $1`

// Begin implements dedupesvc.Store, through dedupesvc.RunBegin: it reads
// first, so a duplicate costs one read and no commit; only a free key is
// written, and then the single upsert decides who holds it.
func (s *Store) Begin(ctx context.Context, p dedupesvc.BeginParams) (dedupesvc.BeginResult, error) {
	if err := s.resume(ctx); err != nil {
		return dedupesvc.BeginResult{}, err
	}
	return dedupesvc.RunBegin(ctx, p, dedupesvc.BeginSteps{
		Read: func(ctx context.Context) (dedupesvc.Record, bool, time.Time, error) {
			row, found, err := s.read(ctx, p.ID())
			return row.Record, found, row.now, err
		},
		MarkUnknown: func(ctx context.Context, epoch int64, _ time.Time) (bool, error) {
			n, err := s.change(ctx, s.markUnknownSQL, p.ID(), p.Scope, p.Key, epoch, p.UnknownRetention.Milliseconds(), p.Namespace)
			if err != nil {
				return false, fmt.Errorf("pgstore: mark outcome unknown: %w", err)
			}
			return n == 1, nil
		},
		Renew: func(ctx context.Context, epoch int64, _ time.Time) (time.Time, bool, error) {
			var until time.Time
			err := s.noted(ctx, s.pool.QueryRow(ctx, renewSQL, p.Scope, p.Key, p.AttemptToken, epoch, p.Lease.Milliseconds(), p.Namespace).Scan(&until))
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				return time.Time{}, false, nil
			case err != nil:
				return time.Time{}, false, fmt.Errorf("pgstore: renew lease: %w", err)
			}
			return until, true, nil
		},
		Usage: func(ctx context.Context) (int64, int64, error) {
			var records, bytes int64
			if err := s.noted(ctx, s.pool.QueryRow(ctx, usageSQL, p.Namespace).Scan(&records, &bytes)); err != nil {
				return 0, 0, fmt.Errorf("pgstore: read usage: %w", err)
			}
			return records, bytes, nil
		},
		Reserve: func(ctx context.Context, _ time.Time) (int64, time.Time, bool, error) {
			var (
				epoch    int64
				leaseEnd time.Time
			)
			err := s.noted(ctx, s.pool.QueryRow(ctx, reserveSQL,
				p.Scope, p.Key, p.Fingerprint, p.AttemptToken, p.Lease.Milliseconds(), p.Retention.Milliseconds(),
				p.OnLostOutcome == dedupesvc.Reexecute, p.Namespace,
			).Scan(&epoch, &leaseEnd))
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				return 0, time.Time{}, false, nil
			case err != nil:
				return 0, time.Time{}, false, fmt.Errorf("pgstore: reserve: %w", err)
			}
			return epoch, leaseEnd, true, nil
		},
	})
}

// record is one row as read by readSQL.
type record struct {
	dedupesvc.Record
	// now is the database's clock when the row was read.
	now time.Time
}

func (s *Store) read(ctx context.Context, id dedupesvc.RecordID) (record, bool, error) {
	var (
		row         record
		typeURL     *string
		keyID       *string
		completedAt *time.Time
	)
	err := s.noted(ctx, s.pool.QueryRow(ctx, readSQL, id.Scope, id.Key, id.Namespace).Scan(
		&row.Fingerprint, &row.State, &row.AttemptToken, &row.Epoch, &typeURL, &row.Outcome.Value, &keyID,
		&row.LeaseExpiresAt, &completedAt, &row.ExpiresAt, &row.now))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return record{}, false, nil
	case err != nil:
		return record{}, false, fmt.Errorf("pgstore: read record: %w", err)
	}
	if typeURL != nil {
		row.Outcome.TypeURL = *typeURL
	}
	if keyID != nil {
		row.Outcome.KeyID = *keyID
	}
	if completedAt != nil {
		row.CompletedAt = *completedAt
	}
	return row, true, nil
}

// finishSQL stores the outcome if the attempt still holds the reservation
// (in flight, or marked unknown after its lease ran out: the real outcome
// settles it), and restarts the retention from now.
var finishSQL = `
UPDATE idemgate_records
` + completeSet(5, 6, 8) + `
WHERE namespace = $7 AND scope = $1 AND idempotency_key = $2 AND attempt_token = $3 AND epoch = $4
  AND state IN ('in_flight', 'unknown')`

// completeSet is the SET clause that stores an outcome, its type URL, value
// and key id taken from parameters $typeURL, $value and $keyID (NULL for a
// plaintext value), and restarts the retention.
func completeSet(typeURL, value, keyID int) string {
	return fmt.Sprintf(`SET state = 'completed',
    outcome_type_url = $%d,
    outcome_value = $%d,
    outcome_key_id = $%d,
    completed_at = now(),
    expires_at = now() + retention_ms * interval '1 millisecond'`, typeURL, value, keyID)
}

// Finish implements dedupesvc.Store.
func (s *Store) Finish(ctx context.Context, p dedupesvc.FinishParams) error {
	if err := s.resume(ctx); err != nil {
		return err
	}
	n, err := s.change(ctx, s.finishSQL, p.ID(), p.Scope, p.Key, p.AttemptToken, p.Epoch, p.Outcome.TypeURL, p.Outcome.Value, p.Namespace, keyIDParam(p.Outcome.KeyID))
	if err != nil {
		return fmt.Errorf("pgstore: finish: %w", err)
	}
	if n == 1 {
		return nil
	}
	row, found, err := s.read(ctx, p.ID())
	if err != nil {
		return err
	}
	return dedupesvc.RefusedFinish(row.Record, found, p)
}

// releaseSQL frees the reservation if the attempt still holds it.
const releaseSQL = `
UPDATE idemgate_records
SET state = 'released', lease_expires_at = now()
WHERE namespace = $5 AND scope = $1 AND idempotency_key = $2 AND attempt_token = $3 AND epoch = $4
  AND state IN ('in_flight', 'unknown')`

// releaseUnknownSQL is the holder's Release with the outcome unknown: its
// in-flight record becomes outcome-unknown at once, its lease ended now,
// kept at least for the unknown retention ($5) like one marked by
// markUnknownSQL.
const releaseUnknownSQL = `
UPDATE idemgate_records
SET state = 'unknown', lease_expires_at = now(),
    expires_at = greatest(expires_at, now() + $5::bigint * interval '1 millisecond')
WHERE namespace = $6 AND scope = $1 AND idempotency_key = $2 AND attempt_token = $3 AND epoch = $4
  AND state = 'in_flight'`

// Release implements dedupesvc.Store.
func (s *Store) Release(ctx context.Context, p dedupesvc.ReleaseParams) error {
	if err := s.resume(ctx); err != nil {
		return err
	}
	var (
		n   int
		err error
	)
	if p.OutcomeUnknown {
		n, err = s.change(ctx, s.releaseUnknownSQL, p.ID(), p.Scope, p.Key, p.AttemptToken, p.Epoch, p.UnknownRetention.Milliseconds(), p.Namespace)
	} else {
		n, err = s.change(ctx, s.releaseSQL, p.ID(), p.Scope, p.Key, p.AttemptToken, p.Epoch, p.Namespace)
	}
	if err != nil {
		return fmt.Errorf("pgstore: release: %w", err)
	}
	if n == 1 {
		return nil
	}
	row, found, err := s.read(ctx, p.ID())
	if err != nil {
		return err
	}
	return dedupesvc.RefusedRelease(row.Record, found, p)
}

// heartbeatSQL renews the lease of the holder of an in-flight reservation,
// and keeps the record from expiring under a handler that outlives its
// retention. A record a duplicate marked unknown (its lease ran out) while
// the holder was in fact alive is revived to in_flight: the heartbeat proves
// the holder runs, and its Finish would be accepted anyway. Resolve bumps the
// epoch, so a settled record is never revived.
const heartbeatSQL = `
UPDATE idemgate_records
SET state = 'in_flight',
    lease_ms = $5::bigint,
    lease_expires_at = now() + $5::bigint * interval '1 millisecond',
    expires_at = greatest(expires_at, now() + $5::bigint * interval '1 millisecond')
WHERE namespace = $6 AND scope = $1 AND idempotency_key = $2 AND attempt_token = $3 AND epoch = $4
  AND state IN ('in_flight', 'unknown')
RETURNING lease_expires_at`

// renewSQL is heartbeatSQL for Begin's renewal of the calling attempt's own
// record whose lease ran out (still in flight, or marked unknown by a
// duplicate meanwhile); the token, epoch and state tests make it a no-op when
// someone took the record over or settled it meanwhile.
const renewSQL = `
UPDATE idemgate_records
SET state = 'in_flight',
    lease_ms = $5::bigint,
    lease_expires_at = now() + $5::bigint * interval '1 millisecond',
    expires_at = greatest(expires_at, now() + $5::bigint * interval '1 millisecond')
WHERE namespace = $6 AND scope = $1 AND idempotency_key = $2 AND attempt_token = $3 AND epoch = $4
  AND state IN ('in_flight', 'unknown')
RETURNING lease_expires_at`

// Heartbeat implements dedupesvc.Store.
func (s *Store) Heartbeat(ctx context.Context, p dedupesvc.HeartbeatParams) (time.Time, error) {
	if err := s.resume(ctx); err != nil {
		return time.Time{}, err
	}
	var until time.Time
	err := s.noted(ctx, s.pool.QueryRow(ctx, heartbeatSQL, p.Scope, p.Key, p.AttemptToken, p.Epoch, p.Lease.Milliseconds(), p.Namespace).Scan(&until))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return time.Time{}, dedupesvc.ErrNotHeld
	case err != nil:
		return time.Time{}, fmt.Errorf("pgstore: heartbeat: %w", err)
	}
	return until, nil
}

// unknownWhere is the condition a record must meet to be resolved: marked
// unknown, or still in flight with its effective lease run out (nobody has
// called with the key since), and not expired. Its namespace is parameter
// $ns.
func unknownWhere(ns int) string {
	return fmt.Sprintf(`
WHERE namespace = $%d AND scope = $1 AND idempotency_key = $2 AND expires_at > now()
  AND (state = 'unknown' OR (state = 'in_flight' AND %s <= now()))`, ns, leaseEnd("r"))
}

// resolveCompleteSQL and resolveReleaseSQL settle an unknown record. Both
// bump the epoch, which fences the attempt that held it: its late Finish,
// Release or Heartbeat gets ErrNotHeld instead of being taken for a retry
// of its own that already took effect, so its outcome never silently
// disappears.
var resolveCompleteSQL = `
UPDATE idemgate_records AS r
` + completeSet(3, 4, 6) + `,
    epoch = epoch + 1` + unknownWhere(5)

var resolveReleaseSQL = `
UPDATE idemgate_records AS r
SET state = 'released', lease_expires_at = now(), epoch = epoch + 1` + unknownWhere(3)

// Resolve implements dedupesvc.Store.
func (s *Store) Resolve(ctx context.Context, p dedupesvc.ResolveParams) error {
	if err := s.resume(ctx); err != nil {
		return err
	}
	var (
		n   int
		err error
	)
	if p.Complete != nil {
		n, err = s.change(ctx, s.resolveCompleteSQL, p.ID(), p.Scope, p.Key, p.Complete.TypeURL, p.Complete.Value, p.Namespace, keyIDParam(p.Complete.KeyID))
	} else {
		n, err = s.change(ctx, s.resolveReleaseSQL, p.ID(), p.Scope, p.Key, p.Namespace)
	}
	if err != nil {
		return fmt.Errorf("pgstore: resolve: %w", err)
	}
	if n == 1 {
		return nil
	}
	row, found, err := s.read(ctx, p.ID())
	if err != nil {
		return err
	}
	return dedupesvc.RefusedResolve(row.Record, found, row.now, p)
}

// deleteExpiredSQL deletes one bounded batch of expired rows, oldest first,
// through the expires_at index. The outer expiry test re-checks each row, so
// a row reserved anew between the two scans survives, and so does an
// in-flight row within its effective lease (inFlightLive).
var deleteExpiredSQL = `
DELETE FROM idemgate_records AS r
WHERE (namespace, scope, idempotency_key) IN (
    SELECT namespace, scope, idempotency_key FROM idemgate_records
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT $1)
  AND expires_at <= now() AND NOT ` + inFlightLive("r") + `
RETURNING namespace, scope, idempotency_key, state = 'unknown'`

// DeleteExpired implements dedupesvc.Store.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, []dedupesvc.RecordID, error) {
	rows, err := s.pool.Query(ctx, deleteExpiredSQL, limit)
	if err = s.noted(ctx, err); err != nil {
		return 0, nil, fmt.Errorf("pgstore: delete expired: %w", err)
	}
	var (
		deleted int
		unknown []dedupesvc.RecordID
		id      dedupesvc.RecordID
		wasLost bool
	)
	_, err = pgx.ForEachRow(rows, []any{&id.Namespace, &id.Scope, &id.Key, &wasLost}, func() error {
		deleted++
		if wasLost {
			unknown = append(unknown, id)
		}
		return nil
	})
	if err != nil {
		return deleted, unknown, fmt.Errorf("pgstore: delete expired: %w", err)
	}
	return deleted, unknown, nil
}

// keyIDParam is an outcome's key id as a parameter: NULL for a plaintext
// outcome, so the column tells sealed rows from plaintext ones.
func keyIDParam(id string) *string {
	if id == "" {
		return nil
	}
	return &id
}

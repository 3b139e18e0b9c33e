// Package sqlitestore is the embedded dedupesvc.Store: SQLite through
// modernc.org/sqlite (pure Go, no cgo), in one file of a data directory. It
// needs no database server, so dedupesvc runs anywhere at once.
//
// SQLite has one writer and every commit waits for an fsync, so the store
// writes the operations of concurrent callers that queue behind a commit
// together in the next transaction, sharing its fsync (GroupCommit); an
// operation that finds the store idle is written at once, alone.
//
// It serves one dedupe service process: times come from that process's clock
// and waiting duplicates are woken in memory. Move to PostgreSQL (pgstore)
// for several dedupe service replicas, high availability, or tool servers on
// more than one machine sharing records through more than one service.
package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/internal/groupcommit"
	"github.com/idemgate/idemgate/migrations"
)

// FileName is the database file's name inside the data directory.
const FileName = "dedupe.db"

// Store is a dedupesvc.Store on one SQLite file. It also implements
// dedupesvc.Notifier, waking waiting Begins in this process.
type Store struct {
	db   *sql.DB
	path string
	// now is the store's clock: the wall time at Open plus the monotonic
	// time elapsed since, so a step of the system clock (NTP, an operator)
	// neither shortens nor stretches a lease while the process runs. Times
	// are stored as Unix milliseconds of this clock.
	now func() time.Time

	waiters dedupesvc.Waiters[dedupesvc.RecordID]
	// lock is the held lock file (lock.go), nil when opened without one.
	lock io.Closer

	// commit is the group commit config; group writes Begins, Finishes,
	// Releases and Heartbeats of concurrent callers in shared transactions
	// (nil with batching off).
	commit GroupCommit
	group  *groupcommit.Group[*op]
	// stmts are hotStatements, prepared.
	stmts map[string]*sql.Stmt
}

// GroupCommit configures how the Store writes the Begins, Finishes,
// Releases and Heartbeats of concurrent callers: SQLite has one writer and
// every commit waits for an fsync (synchronous=FULL), so the operations that
// queue while a commit is in progress are written together in the next
// transaction and share its fsync. An operation that finds the store idle is
// written at once, alone.
type GroupCommit struct {
	// MaxBatch is the most operations one transaction carries; 1 or less
	// turns batching off (each statement its own transaction, as before).
	// Defaults to 128.
	MaxBatch int
	// MaxDelay is how long a batch that formed behind a commit waits for
	// more operations before it is written, unless it fills first; never
	// spent when the store is idle. Defaults to 0.
	MaxDelay time.Duration
}

// DefaultGroupCommit is the GroupCommit a Store uses unless
// WithGroupCommit says otherwise.
var DefaultGroupCommit = GroupCommit{MaxBatch: 128}

// Option configures Open.
type Option func(*Store)

// WithGroupCommit sets how concurrent operations share transactions.
// Defaults to DefaultGroupCommit.
func WithGroupCommit(gc GroupCommit) Option {
	return func(s *Store) { s.commit = gc }
}

var (
	_ dedupesvc.Store    = (*Store)(nil)
	_ dedupesvc.Notifier = (*Store)(nil)
	_ dedupesvc.Resumer  = (*Store)(nil)

	_ dedupesvc.LostOutcomeMarker = (*Store)(nil)
)

// Open opens (creating it and its directory if needed) the store in dir,
// applies its migrations and marks it resumed (MarkResumed): a process that
// opens the store has been away, so every in-flight lease gets one more full
// lease. Only one process may have the store open: Open fails with a
// *LockedError naming the holder while another has it (see LockSuffix).
// Close it when done.
func Open(ctx context.Context, dir string, opts ...Option) (*Store, error) {
	path := filepath.Join(dir, FileName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, explainOpenError(dir, path, fmt.Errorf("sqlitestore: create data directory: %w", err))
	}
	lock, err := lockFile(path)
	if err != nil {
		return nil, explainOpenError(dir, path, err)
	}
	opened := time.Now()
	// time.Since reads the monotonic clock that time.Now recorded.
	s, err := open(ctx, dir, opened, func() time.Duration { return time.Since(opened) }, opts...)
	if err != nil {
		lock.Close()
		return nil, explainOpenError(dir, path, err)
	}
	s.lock = lock
	return s, nil
}

// open is Open with the clock's parts given: the wall time at opening and
// the monotonic time elapsed since.
func open(ctx context.Context, dir string, opened time.Time, elapsed func() time.Duration, opts ...Option) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sqlitestore: create data directory: %w", err)
	}
	path := filepath.Join(dir, FileName)
	// The file holds every key and outcome: only this user may read it,
	// whatever the umask. SQLite gives its -wal and -shm files the
	// database file's mode.
	if err := privateFile(path); err != nil {
		return nil, err
	}
	// WAL lets reads run beside the writer; synchronous=FULL makes a
	// committed reservation survive a power cut, which a store whose whole
	// point is "never run twice" needs; immediate transactions take the
	// write lock up front instead of failing on upgrade.
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	// One connection serialises the statements of this process: SQLite has
	// one writer anyway, and no statement waits on another's lock.
	db.SetMaxOpenConns(1)
	wall := opened.Round(0) // the wall reading only: elapsed carries the monotonic one
	s := &Store{db: db, path: path, now: func() time.Time { return wall.Add(elapsed()) }, commit: DefaultGroupCommit}
	for _, opt := range opts {
		opt(s)
	}
	if s.commit.MaxBatch > 1 {
		// One writer: the store has one connection.
		s.group = groupcommit.New(groupcommit.Config{MaxBatch: s.commit.MaxBatch, MaxDelay: s.commit.MaxDelay, Writers: 1}, s.flush)
	}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if err := s.MarkResumed(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if err := s.prepare(ctx); err != nil {
		db.Close()
		return nil, err
	}
	// -wal and -shm left by an earlier version may be more open.
	for _, suffix := range []string{"-wal", "-shm"} {
		if err := os.Chmod(path+suffix, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			db.Close()
			return nil, fmt.Errorf("sqlitestore: %w", err)
		}
	}
	return s, nil
}

// privateFile creates path with mode 0600 if it is missing and sets an
// existing one to 0600.
func privateFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("sqlitestore: create %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("sqlitestore: create %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return fmt.Errorf("sqlitestore: %w", err)
	}
	return nil
}

// MarkResumed implements dedupesvc.Resumer: from now on every in-flight
// record's lease runs until at least one full lease (its lease_ms) past now.
// Open calls it.
func (s *Store) MarkResumed(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, `UPDATE idemgate_store_state SET resumed_at = max(resumed_at, ?)`, s.now().UnixMilli())
	if err != nil {
		return fmt.Errorf("sqlitestore: mark resumed: %w", err)
	}
	return nil
}

// leaseEnd is the effective end of the lease of the row of table or alias
// t: its own end, or one full lease past the store's last resume, whichever
// is later (see dedupesvc.Resumer). Every statement that treats a lease as
// run out uses it.
func leaseEnd(t string) string {
	return fmt.Sprintf(`max(%[1]s.lease_expires_at, coalesce((SELECT resumed_at FROM idemgate_store_state), 0) + %[1]s.lease_ms)`, t)
}

// expiry is the effective expiry of the row of t (see pgstore and
// dedupesvc.Record.Expiry): an in-flight row stays while its effective
// lease runs and, when its FAIL_CLOSED holder never stored an outcome, for
// its unknown_retention_ms past that lease's end.
func expiry(t string) string {
	return fmt.Sprintf(`(CASE WHEN %[1]s.state = 'in_flight'
        THEN max(%[1]s.expires_at, %[2]s + %[1]s.unknown_retention_ms)
        ELSE %[1]s.expires_at END)`, t, leaseEnd(t))
}

// nextEpoch is a new epoch, higher than every epoch the store handed out
// before to any key: the triggers of migration 007 keep last_epoch at the
// highest one written, in the same statement.
const nextEpoch = `((SELECT last_epoch FROM idemgate_store_state) + 1)`

// Path is the database file.
func (s *Store) Path() string { return s.path }

// Close closes the database and releases its lock.
func (s *Store) Close() error {
	for _, st := range s.stmts {
		_ = st.Close()
	}
	err := s.db.Close()
	if s.lock != nil {
		s.lock.Close()
	}
	return err
}

func (s *Store) migrate(ctx context.Context) error {
	all, err := migrations.List(migrations.SQLite, "sqlite")
	if err != nil {
		return err
	}
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS idemgate_schema_migrations (
		version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("sqlitestore: create migrations table: %w", err)
	}
	for _, m := range all {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		var one int
		err = tx.QueryRowContext(ctx, `SELECT 1 FROM idemgate_schema_migrations WHERE version = ?`, m.Version).Scan(&one)
		if err == nil {
			tx.Rollback()
			continue
		}
		if !errors.Is(err, sql.ErrNoRows) {
			tx.Rollback()
			return err
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			tx.Rollback()
			return fmt.Errorf("sqlitestore: apply migration %s: %w", m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO idemgate_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
			m.Version, m.Name, s.now().UnixMilli()); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// readSQL reads a key's record; an in-flight one's lease end, and its expiry
// when later, are the effective ones (leaseEnd).
var readSQL = `
SELECT fingerprint, state, attempt_token, epoch, outcome_type_url, outcome_value, outcome_key_id,
       CASE WHEN state = 'in_flight' THEN ` + leaseEnd("r") + ` ELSE lease_expires_at END,
       completed_at,
       CASE WHEN state = 'in_flight' THEN max(expires_at, ` + leaseEnd("r") + `) ELSE expires_at END,
       unknown_retention_ms
FROM idemgate_records AS r WHERE namespace = ? AND scope = ? AND idempotency_key = ?`

// reserveSQL takes the key when it is free, repeating DecideBegin's
// conditions atomically, with the effective lease end and expiry; it
// returns no row when the record blocks it. :lost is the reservation's
// unknown retention (BeginParams.LostRetention).
var reserveSQL = `
INSERT INTO idemgate_records (
    namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    retention_ms, lease_ms, unknown_retention_ms, lease_expires_at, expires_at, created_at)
VALUES (:ns, :scope, :key, :fp, 'in_flight', :token, ` + nextEpoch + `, :retention, :lease, :lost, :now + :lease, :now + :retention, :now)
ON CONFLICT (namespace, scope, idempotency_key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    state = 'in_flight',
    attempt_token = excluded.attempt_token,
    epoch = ` + nextEpoch + `,
    retention_ms = excluded.retention_ms,
    lease_ms = excluded.lease_ms,
    unknown_retention_ms = excluded.unknown_retention_ms,
    outcome_type_url = NULL,
    outcome_value = NULL,
    outcome_key_id = NULL,
    lease_expires_at = excluded.lease_expires_at,
    expires_at = excluded.expires_at,
    created_at = excluded.created_at,
    completed_at = NULL
WHERE ` + expiry("idemgate_records") + ` <= :now
   OR (idemgate_records.fingerprint = excluded.fingerprint
       AND (idemgate_records.state = 'released'
            OR (:reexecute AND idemgate_records.state = 'in_flight' AND ` + leaseEnd("idemgate_records") + ` <= :now
                AND idemgate_records.attempt_token <> excluded.attempt_token)))
RETURNING epoch, lease_expires_at`

const usageSQL = `SELECT records, outcome_bytes FROM idemgate_namespace_usage WHERE namespace = ?`

var markUnknownSQL = `
UPDATE idemgate_records
SET state = 'unknown', expires_at = max(expires_at, :now + :unknown)
WHERE namespace = :ns AND scope = :scope AND idempotency_key = :key AND epoch = :epoch
  AND state = 'in_flight' AND ` + leaseEnd("idemgate_records") + ` <= :now`

// Begin implements dedupesvc.Store.
func (s *Store) Begin(ctx context.Context, p dedupesvc.BeginParams) (dedupesvc.BeginResult, error) {
	var res dedupesvc.BeginResult
	err := s.write(ctx, func(ctx context.Context, x exec) error {
		var err error
		res, err = s.begin(ctx, x, p)
		return err
	})
	if err != nil {
		return dedupesvc.BeginResult{}, err
	}
	return res, nil
}

func (s *Store) begin(ctx context.Context, x exec, p dedupesvc.BeginParams) (dedupesvc.BeginResult, error) {
	return dedupesvc.RunBegin(ctx, p, dedupesvc.BeginSteps{
		Read: func(ctx context.Context) (dedupesvc.Record, bool, time.Time, error) {
			now := s.now()
			r, found, err := s.read(ctx, x.q, p.ID())
			return r, found, now, err
		},
		MarkUnknown: func(ctx context.Context, epoch int64, now time.Time) (bool, error) {
			n, err := x.change(ctx, p.ID(), markUnknownSQL,
				sql.Named("now", now.UnixMilli()), sql.Named("unknown", p.UnknownRetention.Milliseconds()),
				sql.Named("ns", p.Namespace), sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("epoch", epoch))
			if err != nil {
				return false, fmt.Errorf("sqlitestore: mark outcome unknown: %w", err)
			}
			return n == 1, nil
		},
		Renew: func(ctx context.Context, epoch int64, now time.Time) (time.Time, bool, error) {
			var until int64
			err := x.q.QueryRowContext(ctx, renewSQL, sql.Named("now", now.UnixMilli()), sql.Named("lease", p.Lease.Milliseconds()),
				sql.Named("ns", p.Namespace), sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("token", p.AttemptToken), sql.Named("epoch", epoch),
				sql.Named("resolve_only", p.ResolveOnly)).Scan(&until)
			switch {
			case errors.Is(err, sql.ErrNoRows):
				return time.Time{}, false, nil
			case err != nil:
				return time.Time{}, false, fmt.Errorf("sqlitestore: renew lease: %w", err)
			}
			return time.UnixMilli(until), true, nil
		},
		Usage: func(ctx context.Context) (int64, int64, error) {
			var records, bytes int64
			err := x.q.QueryRowContext(ctx, usageSQL, p.Namespace).Scan(&records, &bytes)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return 0, 0, fmt.Errorf("sqlitestore: read usage: %w", err)
			}
			return records, bytes, nil
		},
		Reserve: func(ctx context.Context, now time.Time) (int64, time.Time, bool, error) {
			var epoch, leaseEnd int64
			err := x.q.QueryRowContext(ctx, reserveSQL,
				sql.Named("ns", p.Namespace), sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("fp", p.Fingerprint), sql.Named("token", p.AttemptToken),
				sql.Named("retention", p.Retention.Milliseconds()), sql.Named("lease", p.Lease.Milliseconds()),
				sql.Named("now", now.UnixMilli()), sql.Named("reexecute", p.OnLostOutcome == dedupesvc.Reexecute),
				sql.Named("lost", p.LostRetention().Milliseconds()),
			).Scan(&epoch, &leaseEnd)
			switch {
			case errors.Is(err, sql.ErrNoRows):
				return 0, time.Time{}, false, nil
			case err != nil:
				return 0, time.Time{}, false, fmt.Errorf("sqlitestore: reserve: %w", err)
			}
			return epoch, time.UnixMilli(leaseEnd), true, nil
		},
	})
}

func (s *Store) read(ctx context.Context, q querier, id dedupesvc.RecordID) (dedupesvc.Record, bool, error) {
	var (
		r                         dedupesvc.Record
		typeURL, keyID            sql.NullString
		completedAt               sql.NullInt64
		leaseExpiresAt, expiresAt int64
		unknownMS                 int64
	)
	err := q.QueryRowContext(ctx, readSQL, id.Namespace, id.Scope, id.Key).Scan(
		&r.Fingerprint, &r.State, &r.AttemptToken, &r.Epoch, &typeURL, &r.Outcome.Value, &keyID,
		&leaseExpiresAt, &completedAt, &expiresAt, &unknownMS)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return dedupesvc.Record{}, false, nil
	case err != nil:
		return dedupesvc.Record{}, false, fmt.Errorf("sqlitestore: read record: %w", err)
	}
	r.Outcome.TypeURL, r.Outcome.KeyID = typeURL.String, keyID.String
	if r.State == dedupesvc.StateCompleted && r.Outcome.Value == nil {
		r.Outcome.Value = []byte{}
	}
	r.LeaseExpiresAt, r.ExpiresAt = time.UnixMilli(leaseExpiresAt), time.UnixMilli(expiresAt)
	r.UnknownRetention = time.Duration(unknownMS) * time.Millisecond
	if completedAt.Valid {
		r.CompletedAt = time.UnixMilli(completedAt.Int64)
	}
	return r, true, nil
}

// querier is what an operation's statements run on: the database, or the
// transaction of a group commit.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// hotStatements are prepared once, when the store opens: modernc's SQLite
// parses a statement anew at every execution that is not prepared, and the
// parsing cost more CPU than running it.
var hotStatements = []string{readSQL, reserveSQL, usageSQL, markUnknownSQL, renewSQL, finishSQL, releaseSQL, releaseUnknownSQL, heartbeatSQL}

// prepare prepares hotStatements on the store's one connection.
func (s *Store) prepare(ctx context.Context) error {
	s.stmts = make(map[string]*sql.Stmt, len(hotStatements))
	for _, q := range hotStatements {
		st, err := s.db.PrepareContext(ctx, q)
		if err != nil {
			return fmt.Errorf("sqlitestore: prepare: %w", err)
		}
		s.stmts[q] = st
	}
	return nil
}

// preparedQuerier runs the hot statements prepared, on the database or in
// tx; database/sql reuses the statement prepared on the connection the
// transaction holds.
type preparedQuerier struct {
	tx    *sql.Tx // nil: the database
	db    *sql.DB
	stmts map[string]*sql.Stmt
}

func (s *Store) prepared(tx *sql.Tx) preparedQuerier {
	return preparedQuerier{tx: tx, db: s.db, stmts: s.stmts}
}

func (p preparedQuerier) stmt(ctx context.Context, query string) *sql.Stmt {
	st := p.stmts[query]
	if st != nil && p.tx != nil {
		return p.tx.StmtContext(ctx, st)
	}
	return st
}

func (p preparedQuerier) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := p.stmt(ctx, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	if p.tx != nil {
		return p.tx.ExecContext(ctx, query, args...)
	}
	return p.db.ExecContext(ctx, query, args...)
}

func (p preparedQuerier) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := p.stmt(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	if p.tx != nil {
		return p.tx.QueryRowContext(ctx, query, args...)
	}
	return p.db.QueryRowContext(ctx, query, args...)
}

// exec is where an operation runs: q for its statements, wake for the
// records it changed, whose waiters must learn of it once it is committed.
type exec struct {
	q    querier
	wake func(dedupesvc.RecordID)
}

// change runs a state-changing statement and, if it changed the record,
// wakes this process's waiters on it (once committed).
func (x exec) change(ctx context.Context, id dedupesvc.RecordID, query string, args ...any) (int64, error) {
	res, err := x.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	if n > 0 {
		x.wake(id)
	}
	return n, nil
}

// op is one caller's operation, written in a group commit's transaction.
type op struct {
	run func(ctx context.Context, x exec) error
	err error
	// sent and answered time the operation's stages for the service's
	// metrics (dedupesvc.StageTimer); set by flush.
	sent, answered time.Time
}

// write runs fn in a group commit when batching is on, else on the
// database directly.
func (s *Store) write(ctx context.Context, fn func(ctx context.Context, x exec) error) error {
	stages := dedupesvc.StageTimerFrom(ctx)
	if s.group == nil {
		start := time.Now()
		err := fn(ctx, exec{q: s.prepared(nil), wake: s.waiters.Wake})
		stages.AddStatement(0, time.Since(start))
		return err
	}
	o := &op{run: fn}
	queued := time.Now()
	if err := s.group.Do(ctx, o); err != nil {
		return err
	}
	stages.AddStatement(o.sent.Sub(queued), o.answered.Sub(o.sent))
	return o.err
}

// answered reports whether err is an operation's answer rather than a
// failure of the store: such an operation changed nothing, and the
// transaction it ran in can go on and commit.
func answered(err error) bool {
	return err == nil || errors.Is(err, dedupesvc.ErrNotHeld) || errors.Is(err, dedupesvc.ErrQuotaExceeded) ||
		errors.Is(err, dedupesvc.ErrNotUnknown) || errors.Is(err, dedupesvc.ErrRecordNotFound)
}

// flush writes a batch in one transaction, one commit and one fsync. The
// operations run one after the other in it, each seeing the ones before, so
// concurrent Begins of one key get the answers they would get one after the
// other. When one fails (not merely refused), the transaction is rolled back
// and each operation is written alone, so a caller gets only its own error.
// Waiters are woken only after the commit.
func (s *Store) flush(ctx context.Context, ops []*op) {
	sent := time.Now()
	defer func() {
		answered := time.Now()
		for _, o := range ops {
			o.sent, o.answered = sent, answered
		}
	}()
	if len(ops) > 1 {
		if woken, ok := s.transaction(ctx, ops); ok {
			for _, id := range woken {
				s.waiters.Wake(id)
			}
			return
		}
	}
	// Alone, each statement is its own transaction, as without batching:
	// a duplicate's read takes no write lock and commits nothing.
	for _, o := range ops {
		o.err = o.run(ctx, exec{q: s.prepared(nil), wake: s.waiters.Wake})
	}
}

// transaction runs ops in one transaction and commits it; it reports false,
// having rolled back, when one of them failed (not merely refused: each
// op's err is then stale). A failed commit fails every op.
func (s *Store) transaction(ctx context.Context, ops []*op) (woken []dedupesvc.RecordID, ok bool) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		for _, o := range ops {
			o.err = fmt.Errorf("sqlitestore: begin transaction: %w", err)
		}
		return nil, true
	}
	x := exec{q: s.prepared(tx), wake: func(id dedupesvc.RecordID) { woken = append(woken, id) }}
	for _, o := range ops {
		o.err = o.run(ctx, x)
		if !answered(o.err) {
			_ = tx.Rollback()
			return nil, false
		}
	}
	if err := tx.Commit(); err != nil {
		for _, o := range ops {
			o.err = fmt.Errorf("sqlitestore: commit: %w", err)
		}
		return nil, true
	}
	return woken, true
}

// GroupCommitStats returns how many transactions the group commit wrote and
// how many operations they carried (0, 0 with it off).
func (s *Store) GroupCommitStats() (commits, operations int64) {
	if s.group == nil {
		return 0, 0
	}
	return s.group.Stats()
}

const finishSQL = `
UPDATE idemgate_records
SET state = 'completed', outcome_type_url = :type_url, outcome_value = :value, outcome_key_id = nullif(:key_id, ''),
    completed_at = :now, expires_at = :now + retention_ms
WHERE namespace = :ns AND scope = :scope AND idempotency_key = :key AND attempt_token = :token AND epoch = :epoch
  AND (state = 'in_flight' OR (state = 'unknown' AND NOT :resolve_only))`

// Finish implements dedupesvc.Store.
func (s *Store) Finish(ctx context.Context, p dedupesvc.FinishParams) error {
	_, err := s.FinishWithinQuota(ctx, p)
	return err
}

// FinishWithinQuota implements dedupesvc.QuotaFinisher. The usage totals
// are kept in the writing transaction (migration 004) and there is one
// writer, so the quota is exact: no two Finishes see the same total.
func (s *Store) FinishWithinQuota(ctx context.Context, p dedupesvc.FinishParams) (bool, error) {
	var replaced bool
	err := s.write(ctx, func(ctx context.Context, x exec) error {
		var err error
		replaced, err = s.finish(ctx, x, p)
		return err
	})
	return replaced, err
}

func (s *Store) finish(ctx context.Context, x exec, p dedupesvc.FinishParams) (bool, error) {
	out, replaced := p.Outcome, false
	if p.MaxOutcomeBytes > 0 && p.OverQuota != nil {
		var records, bytes int64
		err := x.q.QueryRowContext(ctx, usageSQL, p.Namespace).Scan(&records, &bytes)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return false, fmt.Errorf("sqlitestore: read usage: %w", err)
		}
		if bytes+int64(len(out.Value)) > p.MaxOutcomeBytes {
			out, replaced = *p.OverQuota, true
		}
	}
	value := out.Value
	if value == nil {
		value = []byte{}
	}
	n, err := x.change(ctx, p.ID(), finishSQL,
		sql.Named("type_url", out.TypeURL), sql.Named("value", value), sql.Named("key_id", out.KeyID), sql.Named("now", s.now().UnixMilli()),
		sql.Named("ns", p.Namespace), sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("token", p.AttemptToken), sql.Named("epoch", p.Epoch),
		sql.Named("resolve_only", p.ResolveOnly))
	if err != nil {
		return false, fmt.Errorf("sqlitestore: finish: %w", err)
	}
	if n == 1 {
		return replaced, nil
	}
	row, found, err := s.read(ctx, x.q, p.ID())
	if err != nil {
		return false, err
	}
	return false, dedupesvc.RefusedFinish(row, found, p)
}

const releaseSQL = `
UPDATE idemgate_records SET state = 'released', lease_expires_at = :now
WHERE namespace = :ns AND scope = :scope AND idempotency_key = :key AND attempt_token = :token AND epoch = :epoch
  AND (state = 'in_flight' OR (state = 'unknown' AND NOT :resolve_only))`

// releaseUnknownSQL is Release with the outcome unknown: the holder's
// in-flight record becomes outcome-unknown at once, kept at least for the
// unknown retention.
const releaseUnknownSQL = `
UPDATE idemgate_records SET state = 'unknown', lease_expires_at = :now, expires_at = max(expires_at, :now + :unknown)
WHERE namespace = :ns AND scope = :scope AND idempotency_key = :key AND attempt_token = :token AND epoch = :epoch
  AND state = 'in_flight'`

// Release implements dedupesvc.Store.
func (s *Store) Release(ctx context.Context, p dedupesvc.ReleaseParams) error {
	return s.write(ctx, func(ctx context.Context, x exec) error { return s.release(ctx, x, p) })
}

func (s *Store) release(ctx context.Context, x exec, p dedupesvc.ReleaseParams) error {
	query := releaseSQL
	if p.OutcomeUnknown {
		query = releaseUnknownSQL
	}
	n, err := x.change(ctx, p.ID(), query, sql.Named("now", s.now().UnixMilli()), sql.Named("unknown", p.UnknownRetention.Milliseconds()),
		sql.Named("ns", p.Namespace), sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("token", p.AttemptToken), sql.Named("epoch", p.Epoch),
		sql.Named("resolve_only", p.ResolveOnly))
	if err != nil {
		return fmt.Errorf("sqlitestore: release: %w", err)
	}
	if n == 1 {
		return nil
	}
	row, found, err := s.read(ctx, x.q, p.ID())
	if err != nil {
		return err
	}
	return dedupesvc.RefusedRelease(row, found, p)
}

// releaseLostSQL frees a record held by an attempt whose Begin's answer
// was lost, whatever its epoch (see pgstore).
const releaseLostSQL = `
UPDATE idemgate_records SET state = 'released', lease_expires_at = :now
WHERE namespace = :ns AND scope = :scope AND idempotency_key = :key AND attempt_token = :token
  AND (state = 'in_flight' OR (state = 'unknown' AND NOT :resolve_only))`

// ReleaseLost implements dedupesvc.Store: every attempt's releaseLostSQL in
// one write, so one transaction and one commit.
func (s *Store) ReleaseLost(ctx context.Context, p dedupesvc.ReleaseLostParams) (int, error) {
	var released int
	err := s.write(ctx, func(ctx context.Context, x exec) error {
		released = 0 // a group commit may run it again alone
		now := s.now().UnixMilli()
		for _, a := range p.Attempts {
			n, err := x.change(ctx, dedupesvc.RecordID{Namespace: p.Namespace, Scope: a.Scope, Key: a.Key}, releaseLostSQL,
				sql.Named("now", now), sql.Named("ns", p.Namespace), sql.Named("scope", a.Scope), sql.Named("key", a.Key),
				sql.Named("token", a.AttemptToken), sql.Named("resolve_only", p.ResolveOnly))
			if err != nil {
				return fmt.Errorf("sqlitestore: release lost Begins: %w", err)
			}
			released += int(n)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return released, nil
}

// heartbeatSQL renews the holder's lease; it also revives a record a
// duplicate marked unknown while the holder was in fact alive (see pgstore).
const heartbeatSQL = `
UPDATE idemgate_records
SET state = 'in_flight', lease_ms = :lease, lease_expires_at = :now + :lease, expires_at = max(expires_at, :now + :lease)
WHERE namespace = :ns AND scope = :scope AND idempotency_key = :key AND attempt_token = :token AND epoch = :epoch
  AND (state = 'in_flight' OR (state = 'unknown' AND NOT :resolve_only))
RETURNING lease_expires_at`

// renewSQL is heartbeatSQL for Begin's renewal of the calling attempt's own
// in-flight record whose lease ran out; a no-op when the record was taken
// over or settled meanwhile.
const renewSQL = `
UPDATE idemgate_records
SET state = 'in_flight', lease_ms = :lease, lease_expires_at = :now + :lease, expires_at = max(expires_at, :now + :lease)
WHERE namespace = :ns AND scope = :scope AND idempotency_key = :key AND attempt_token = :token AND epoch = :epoch
  AND (state = 'in_flight' OR (state = 'unknown' AND NOT :resolve_only))
RETURNING lease_expires_at`

// Heartbeat implements dedupesvc.Store.
func (s *Store) Heartbeat(ctx context.Context, p dedupesvc.HeartbeatParams) (time.Time, error) {
	var until time.Time
	err := s.write(ctx, func(ctx context.Context, x exec) error {
		var err error
		until, err = s.heartbeat(ctx, x, p)
		return err
	})
	if err != nil {
		return time.Time{}, err
	}
	return until, nil
}

func (s *Store) heartbeat(ctx context.Context, x exec, p dedupesvc.HeartbeatParams) (time.Time, error) {
	var until int64
	err := x.q.QueryRowContext(ctx, heartbeatSQL, sql.Named("now", s.now().UnixMilli()), sql.Named("lease", p.Lease.Milliseconds()),
		sql.Named("ns", p.Namespace), sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("token", p.AttemptToken), sql.Named("epoch", p.Epoch),
		sql.Named("resolve_only", p.ResolveOnly)).Scan(&until)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return time.Time{}, dedupesvc.ErrNotHeld
	case err != nil:
		return time.Time{}, fmt.Errorf("sqlitestore: heartbeat: %w", err)
	}
	return time.UnixMilli(until), nil
}

var unknownWhere = `
WHERE namespace = :ns AND scope = :scope AND idempotency_key = :key AND ` + expiry("idemgate_records") + ` > :now
  AND (state = 'unknown' OR (state = 'in_flight' AND ` + leaseEnd("idemgate_records") + ` <= :now))`

// resolveCompleteSQL and resolveReleaseSQL settle an unknown record and
// give it a new epoch (nextEpoch), fencing the attempt that held it: its late Finish, Release
// or Heartbeat gets ErrNotHeld instead of passing for a retry.
var resolveCompleteSQL = `
UPDATE idemgate_records
SET state = 'completed', outcome_type_url = :type_url, outcome_value = :value, outcome_key_id = nullif(:key_id, ''),
    completed_at = :now, expires_at = :now + retention_ms, epoch = ` + nextEpoch + unknownWhere

var resolveReleaseSQL = `
UPDATE idemgate_records SET state = 'released', lease_expires_at = :now, epoch = ` + nextEpoch + unknownWhere

// Resolve implements dedupesvc.Store.
func (s *Store) Resolve(ctx context.Context, p dedupesvc.ResolveParams) error {
	now := s.now()
	args := []any{sql.Named("now", now.UnixMilli()), sql.Named("ns", p.Namespace), sql.Named("scope", p.Scope), sql.Named("key", p.Key)}
	query := resolveReleaseSQL
	if p.Complete != nil {
		value := p.Complete.Value
		if value == nil {
			value = []byte{}
		}
		query = resolveCompleteSQL
		args = append(args, sql.Named("type_url", p.Complete.TypeURL), sql.Named("value", value), sql.Named("key_id", p.Complete.KeyID))
	}
	n, err := exec{q: s.prepared(nil), wake: s.waiters.Wake}.change(ctx, p.ID(), query, args...)
	if err != nil {
		return fmt.Errorf("sqlitestore: resolve: %w", err)
	}
	if n == 1 {
		return nil
	}
	row, found, err := s.read(ctx, s.db, p.ID())
	if err != nil {
		return err
	}
	return dedupesvc.RefusedResolve(row, found, now, p)
}

// deleteExpiredSQL deletes a batch of expired records (expiry: an
// in-flight one within its effective lease, or a dead FAIL_CLOSED holder's
// within its unknown retention, stays); the batch is chosen among deletable
// records only, so records that must stay never fill it (see pgstore). A
// FAIL_CLOSED holder's in-flight record deleted here is reported unknown.
var deleteExpiredSQL = `
DELETE FROM idemgate_records
WHERE rowid IN (
    SELECT c.rowid FROM idemgate_records AS c
    WHERE c.expires_at <= :now AND ` + expiry("c") + ` <= :now
    ORDER BY c.expires_at LIMIT :limit)
  AND ` + expiry("idemgate_records") + ` <= :now
RETURNING namespace, scope, idempotency_key, state = 'unknown' OR (state = 'in_flight' AND unknown_retention_ms > 0)`

// DeleteExpired implements dedupesvc.Store.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, []dedupesvc.RecordID, error) {
	rows, err := s.db.QueryContext(ctx, deleteExpiredSQL, sql.Named("now", s.now().UnixMilli()), sql.Named("limit", limit))
	if err != nil {
		return 0, nil, fmt.Errorf("sqlitestore: delete expired: %w", err)
	}
	defer rows.Close()
	var (
		deleted int
		unknown []dedupesvc.RecordID
	)
	for rows.Next() {
		var (
			id      dedupesvc.RecordID
			wasLost bool
		)
		if err := rows.Scan(&id.Namespace, &id.Scope, &id.Key, &wasLost); err != nil {
			return deleted, unknown, fmt.Errorf("sqlitestore: delete expired: %w", err)
		}
		deleted++
		if wasLost {
			unknown = append(unknown, id)
		}
	}
	return deleted, unknown, rows.Err()
}

// markLostSQL marks outcome-unknown a batch of in-flight records of
// FAIL_CLOSED holders one full lease past their effective lease's end (see
// pgstore's lostAfter), oldest first, through the partial index of
// FAIL_CLOSED in-flight records (migration 007), kept for their unknown
// retention past that lease's end. SQLite has one writer, so one statement
// marks the whole batch.
var markLostSQL = `
UPDATE idemgate_records
SET state = 'unknown', expires_at = max(expires_at, ` + leaseEnd("idemgate_records") + ` + unknown_retention_ms)
WHERE rowid IN (
    SELECT c.rowid FROM idemgate_records AS c
    WHERE c.state = 'in_flight' AND c.unknown_retention_ms > 0 AND ` + leaseEnd("c") + ` + c.lease_ms <= :now
    ORDER BY c.created_at LIMIT :limit)
RETURNING namespace, scope, idempotency_key`

// MarkLostOutcomes implements dedupesvc.LostOutcomeMarker; it wakes this
// process's duplicates waiting on each record it marked.
func (s *Store) MarkLostOutcomes(ctx context.Context, limit int) (int, error) {
	rows, err := s.db.QueryContext(ctx, markLostSQL, sql.Named("now", s.now().UnixMilli()), sql.Named("limit", limit))
	if err != nil {
		return 0, fmt.Errorf("sqlitestore: mark lost outcomes: %w", err)
	}
	var marked []dedupesvc.RecordID
	for rows.Next() {
		var id dedupesvc.RecordID
		if err := rows.Scan(&id.Namespace, &id.Scope, &id.Key); err != nil {
			rows.Close()
			return 0, fmt.Errorf("sqlitestore: mark lost outcomes: %w", err)
		}
		marked = append(marked, id)
	}
	if err := rows.Close(); err != nil {
		return 0, fmt.Errorf("sqlitestore: mark lost outcomes: %w", err)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("sqlitestore: mark lost outcomes: %w", err)
	}
	for _, id := range marked {
		s.waiters.Wake(id)
	}
	return len(marked), nil
}

// Subscribe implements dedupesvc.Notifier: every change to a record in this
// process wakes its subscribers. A record no longer in flight wakes the
// subscriber at once, so a change between its Begin and Subscribe is not
// missed.
func (s *Store) Subscribe(ctx context.Context, id dedupesvc.RecordID) (<-chan struct{}, func()) {
	ch, unsubscribe := s.waiters.Add(id)
	if row, found, err := s.read(ctx, s.db, id); err != nil || !found || row.State != dedupesvc.StateInFlight {
		s.waiters.Wake(id)
	}
	return ch, unsubscribe
}

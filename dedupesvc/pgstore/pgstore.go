// Package pgstore is the PostgreSQL implementation of dedupesvc.Store, on
// pgx/v5 and pgxpool.
//
// Every state change is one statement under READ COMMITTED; the reservation
// commits before the tool's handler runs and no row lock outlives the
// transaction that took it. A Begin of a fresh key, and a duplicate's Begin,
// are one statement each (reserve or read); a duplicate writes nothing. The
// Begins and Finishes of concurrent callers that arrive while the store's
// writers are busy share one transaction, one round trip and one commit
// (GroupCommit); no row lock is held across a round trip the caller waits
// on, and none across user code. The SQL avoids advisory locks; it uses
// two PostgreSQL-only features: NOTIFY to wake waiting duplicates, a hint
// that can be turned off (WithoutNotify), leaving waiters to poll; and
// pg_postmaster_start_time(), so a database restart never counts against a
// live holder's lease.
//
// On the coordinator of a Citus cluster whose schema migration 013
// distributed, the Store runs WithCitus (DetectCitus tells): the same
// statements in the forms Citus accepts on distributed tables.
package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/internal/groupcommit"
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
	finishSQL, releaseSQL, releaseLostSQL, releaseUnknownSQL, resolveCompleteSQL, resolveReleaseSQL, markUnknownSQL, markLostSQL string
	// cutOff is set when a statement failed because the database could not
	// be reached, and cleared only once a mark of the resume that started
	// after it committed; until then every statement waits for that mark
	// (see resume). It is read without resumeMu on the fast path.
	cutOff atomic.Bool
	// resumeMu guards cutGen (failures noted so far) and marking (the mark
	// in progress, nil when none).
	resumeMu sync.Mutex
	cutGen   uint64
	marking  *markCall
	// markHook, when set (tests), runs inside MarkResumed before its
	// statement, with the mark's context; markWaiting counts operations
	// waiting for a pending mark.
	markHook    func(context.Context)
	markWaiting atomic.Int32
	// markTimeouts counts resume's marks in a row that ran out of their
	// own time (markTimeout), under resumeMu.
	markTimeouts int
	// awayErr is the error of resume's last mark when it failed because
	// the database could not be reached or refused it as read-only (cuts;
	// nil otherwise); until awayUntil,
	// resume fails at once with it instead of marking (and connecting)
	// again. awayDelay is the backoff that set awayUntil (awayBackoff).
	// All three under resumeMu.
	awayErr   error
	awayUntil time.Time
	awayDelay time.Duration
	// failedMarks and pacedCalls count for AwayStats.
	failedMarks, pacedCalls atomic.Int64
	// commit is the group commit config; group batches Begin's first
	// statement and Finish (nil with batching off).
	commit GroupCommit
	group  *groupcommit.Group[*op]
	// citus selects the Citus forms of the statements (WithCitus);
	// citusForms caches them by plain form, under citusMu.
	citus      bool
	citusMu    sync.Mutex
	citusForms map[string]string
	// citusExtra holds the extra parameters of Citus forms (citusForm).
	citusExtra map[string][]string
	// nodes is the resume state of each Citus node group (WithCitus),
	// under resumeMu: on Citus a failure is noted, and the resume marked,
	// per worker (resumeNodes).
	nodes nodeStates
	// usageVacuumEvery is how many usage changes compactions move between
	// two vacuums of idemgate_usage_changes (WithUsageVacuumEvery);
	// usageMoved counts them since the last; usageVacuum is 0 until known,
	// 1 when this role may vacuum the table, -1 when it may not or the
	// database refused (vacuumUsage). usageVacuums counts the vacuums run.
	usageVacuumEvery int64
	usageMoved       atomic.Int64
	usageVacuum      atomic.Int32
	usageVacuums     atomic.Int64
}

// DefaultUsageVacuumEvery is how many usage changes compactions move
// between two vacuums of idemgate_usage_changes by the compacting replica:
// 100,000, a minute at 1,000 fresh keys a second.
const DefaultUsageVacuumEvery = 100_000

// WithUsageVacuumEvery sets how many usage changes compactions move before
// the compacting replica vacuums idemgate_usage_changes itself (0: never).
// Every fresh key appends changes that a compaction deletes a second later,
// and a compaction round scans the whole table, dead rows included: on a
// PostgreSQL whose autovacuum is off or behind, that scan grew without
// bound (a 30-minute run at 3,000 calls a second left 4.6 million dead rows,
// 311 MB, scanned twice a second). Defaults to DefaultUsageVacuumEvery.
func WithUsageVacuumEvery(n int64) Option {
	return func(s *Store) { s.usageVacuumEvery = n }
}

// GroupCommit configures how the Store writes the first statements of
// concurrent Begins and concurrent Finishes: several in one transaction, so
// their callers share one round trip and one commit (one WAL flush). A Begin
// or Finish that finds a writer free is sent at once, alone; batches form
// only from the ones that arrive while every writer is busy.
type GroupCommit struct {
	// MaxBatch is the most statements one transaction carries; 1 or less
	// turns batching off (each statement its own transaction, as before).
	// Defaults to 64.
	MaxBatch int
	// MaxDelay is how long a batch that formed behind busy writers waits
	// for more statements before it is sent, unless it fills first; never
	// spent by a statement that finds a writer free. Defaults to 0.
	MaxDelay time.Duration
	// Writers is how many batches are in flight at once, each on its own
	// pool connection. Defaults to 2: fewer writers make bigger batches, so
	// fewer commits, and a commit costs the database more than a statement
	// in a batch. On the 2-core machine of BENCHMARKS.md, Begin+Finish pairs
	// from 16 callers took 234-259µs with 2 writers, 294-323µs with 4 and
	// 371-376µs with 8 (1.6, 2.7 and 4.8 statements a commit); from 64
	// callers 144-154µs, 156-179µs and 196-226µs. A database with more
	// cores may take more writers.
	Writers int
}

// DefaultGroupCommit is the GroupCommit a Store uses unless
// WithGroupCommit says otherwise.
var DefaultGroupCommit = GroupCommit{MaxBatch: 64, Writers: 2}

// WithGroupCommit sets how concurrent Begins and Finishes share
// transactions. Defaults to DefaultGroupCommit.
func WithGroupCommit(gc GroupCommit) Option {
	return func(s *Store) { s.commit = gc }
}

var (
	_ dedupesvc.Store   = (*Store)(nil)
	_ dedupesvc.Resumer = (*Store)(nil)

	_ dedupesvc.LostOutcomeMarker = (*Store)(nil)
	_ dedupesvc.UsageCompactor    = (*Store)(nil)
	_ dedupesvc.UsageLagCompactor = (*Store)(nil)
	_ dedupesvc.QuotaFinisher     = (*Store)(nil)
	_ dedupesvc.UsageReader       = (*Store)(nil)
	_ dedupesvc.FinishChecker     = (*Store)(nil)
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
	s := &Store{pool: pool, channel: DefaultChannel, commit: DefaultGroupCommit}
	s.usageVacuumEvery = DefaultUsageVacuumEvery
	for _, opt := range opts {
		opt(s)
	}
	if s.citus {
		s.citusForms, s.citusExtra = map[string]string{}, map[string][]string{}
		s.commit.MaxBatch = 1
	}
	if s.commit.MaxBatch > 1 {
		s.group = groupcommit.New(groupcommit.Config{MaxBatch: s.commit.MaxBatch, MaxDelay: s.commit.MaxDelay, Writers: s.commit.Writers}, s.flush)
	}
	s.finishSQL = s.announcedFinish(finishSQL, 14)
	s.releaseSQL = s.announced(releaseSQL, 7)
	s.releaseLostSQL = s.announced(releaseLostSQL, 6)
	s.releaseUnknownSQL = s.announced(releaseUnknownSQL, 7)
	s.resolveCompleteSQL = s.announced(resolveCompleteSQL, 7)
	s.resolveReleaseSQL = s.announced(resolveReleaseSQL, 4)
	s.markUnknownSQL = s.announced(markUnknownSQL, 6)
	s.markLostSQL = s.announced(markLostSQL, 5)
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
	if s.citus {
		// The coordinator sends the NOTIFY afterwards (notifyAfter).
		return s.q(fmt.Sprintf("WITH changed AS (%s\nRETURNING waiters)\nSELECT count(*), coalesce(bool_or(waiters), false) FROM changed", update))
	}
	if s.channel == "" {
		return fmt.Sprintf("WITH changed AS (%s\nRETURNING 1)\nSELECT count(*) FROM changed", update)
	}
	return fmt.Sprintf(`WITH changed AS (%s
RETURNING waiters),
notified AS (SELECT pg_notify($%d, $%d) FROM changed WHERE waiters)
SELECT (SELECT count(*) FROM changed) + 0 * (SELECT count(*) FROM notified)`, update, next, next+1)
}

// announcedFinish is announced for finishSQL, which also answers whether the
// outcome fitted the quota (false: the marker was stored in its place; true
// when no row changed).
func (s *Store) announcedFinish(update string, next int) string {
	if s.citus {
		return s.q(fmt.Sprintf("WITH changed AS (%s\nRETURNING q.fits, r.waiters)\nSELECT count(*), coalesce(bool_and(fits), true), coalesce(bool_or(waiters), false) FROM changed", update))
	}
	if s.channel == "" {
		return fmt.Sprintf("WITH changed AS (%s\nRETURNING q.fits)\nSELECT count(*), coalesce(bool_and(fits), true) FROM changed", update)
	}
	return fmt.Sprintf(`WITH changed AS (%s
RETURNING r.waiters, q.fits),
notified AS (SELECT pg_notify($%d, $%d) FROM changed WHERE waiters)
SELECT (SELECT count(*) FROM changed) + 0 * (SELECT count(*) FROM notified), coalesce((SELECT bool_and(fits) FROM changed), true)`, update, next, next+1)
}

// change runs one of the announced statements and reports how many rows it
// changed.
func (s *Store) change(ctx context.Context, sql string, id dedupesvc.RecordID, args ...any) (int, error) {
	if err := s.resumeFor(ctx, id); err != nil {
		return 0, err
	}
	var n int
	if s.citus {
		var err error
		if args, err = s.citusExtraArgs(ctx, sql, args); err != nil {
			return 0, err
		}
		var woken bool
		err = s.pool.QueryRow(ctx, sql, args...).Scan(&n, &woken)
		if err == nil {
			s.notifyAfter(ctx, woken, NotifyID(id))
		}
		return n, s.notedFor(ctx, id, err)
	}
	if s.channel != "" {
		args = append(args, s.channel, NotifyID(id))
	}
	err := s.pool.QueryRow(ctx, sql, args...).Scan(&n)
	return n, s.notedFor(ctx, id, err)
}

// op is one single-row statement that may share a transaction with others
// (GroupCommit).
type op struct {
	// order sorts a batch's statements by record, so that two batches lock
	// the rows they share in one order and cannot deadlock on them. That
	// holds because a statement locks only its own record: the usage
	// triggers append (migration 010) instead of updating shared counter
	// rows, and the sweeper skips rows a batch holds (deleteExpiredSQL).
	order string
	// id is the record the statement is on.
	id   dedupesvc.RecordID
	sql  string
	args []any
	// scan reads the statement's row into the caller's variables.
	scan func(pgx.Row) error
	err  error
	// queued, sent and answered time the statement's stages for the
	// service's metrics (dedupesvc.StageTimer): set by run and flush.
	queued, sent, answered time.Time
}

func orderOf(id dedupesvc.RecordID) string {
	return id.Namespace + "\x00" + id.Scope + "\x00" + id.Key
}

// run runs o, in a batch when group commit is on, and returns its error.
func (s *Store) run(ctx context.Context, o *op) error {
	if err := s.resumeFor(ctx, o.id); err != nil {
		return err
	}
	stages := dedupesvc.StageTimerFrom(ctx)
	if s.group == nil {
		start := time.Now()
		err := o.scan(s.pool.QueryRow(ctx, o.sql, o.args...))
		stages.AddStatement(0, time.Since(start))
		return s.notedFor(ctx, o.id, err)
	}
	o.queued = time.Now()
	if err := s.group.Do(ctx, o); err != nil {
		return err
	}
	stages.AddStatement(o.sent.Sub(o.queued), o.answered.Sub(o.sent))
	return s.noted(ctx, o.err)
}

// flush writes a batch as one pgx.Batch: one round trip and one implicit
// transaction, so one commit. Each statement sees the ones before it, so
// concurrent Begins of one key in one batch get the answers they would get
// one after the other. When a statement fails the whole transaction rolls
// back; then each statement is run alone, so a caller gets only its own
// error (a deadlock, a refused row), never a neighbour's.
func (s *Store) flush(ctx context.Context, ops []*op) {
	sent := time.Now()
	defer func() {
		answered := time.Now()
		for _, o := range ops {
			if o.sent.IsZero() {
				o.sent = sent
			}
			o.answered = answered
		}
	}()
	if len(ops) == 1 {
		ops[0].err = ops[0].scan(s.pool.QueryRow(ctx, ops[0].sql, ops[0].args...))
		return
	}
	slices.SortStableFunc(ops, func(a, b *op) int { return strings.Compare(a.order, b.order) })
	b := &pgx.Batch{}
	for _, o := range ops {
		b.Queue(o.sql, o.args...).QueryRow(func(row pgx.Row) error {
			o.err = o.scan(row)
			return o.err
		})
	}
	err := s.pool.SendBatch(ctx, b).Close()
	if err == nil {
		return
	}
	if ctx.Err() != nil || unreachable(ctx, err) {
		for _, o := range ops {
			o.err = err
		}
		return
	}
	for _, o := range ops {
		o.err = o.scan(s.pool.QueryRow(ctx, o.sql, o.args...))
	}
}

// GroupCommitStats returns how many transactions the group commit wrote and
// how many statements they carried (0, 0 with it off).
func (s *Store) GroupCommitStats() (commits, statements int64) {
	if s.group == nil {
		return 0, 0
	}
	return s.group.Stats()
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
//
// On Citus it marks the shards of every worker (markNodes): one worker's
// marks need only that worker and the coordinator.
func (s *Store) MarkResumed(ctx context.Context) error {
	if s.citus {
		return s.markNodes(ctx)
	}
	if s.markHook != nil {
		s.markHook(ctx)
	}
	if _, err := s.pool.Exec(ctx, s.q(markResumedSQL)); err != nil {
		return fmt.Errorf("pgstore: mark resumed: %w", s.noted(ctx, err))
	}
	return nil
}

// markCall is one mark of the resume that other operations wait for.
type markCall struct {
	done chan struct{}
	// err is the mark's error; gaveUp says it was the marking caller's
	// context, or the mark's own time (markTimeout), that ended, not the
	// database that failed.
	err    error
	gaveUp bool
}

// markTimeout bounds one mark of the resume that resume makes: half the
// shortest lease (dedupesvc.MinLease), doubled after each mark in a row
// that ran out of it, up to 8s. Every operation of the replica waits for
// the mark, its holders' renewals included, and the marking caller may
// have no deadline (the sweeper's never ends): a mark stuck on a
// connection the network dropped would stall the replica until other
// replicas take its holders' keys. One whose time ran out counts as given
// up, so the next operation marks again on another connection; the growth
// lets a database that answers slowly, but answers, be marked after all.
func markTimeout(timedOut int) time.Duration {
	d := dedupesvc.MinLease / 2
	for range min(timedOut, 4) {
		d *= 2
	}
	return d
}

// Bounds of the backoff between resume's marks while the database cannot
// be reached (awayBackoff).
const (
	resumeBackoffMin = 50 * time.Millisecond
	resumeBackoffCap = time.Second
)

// awayBackoff is the backoff after a mark that found the database
// unreachable, given the previous one (0 after a success): doubled from
// resumeBackoffMin up to resumeBackoffCap. Each mark connects anew (the
// outage closed the pool's connections), so without it a replica under
// load connected about once per call: over a thousand refused connects a
// second, and on loopback some connected to themselves and held the
// restarted database's port.
func awayBackoff(prev time.Duration) time.Duration {
	return min(max(2*prev, resumeBackoffMin), resumeBackoffCap)
}

// jittered is a wait of between half of d and d, so the replicas that lost
// the database together do not come back in step.
func jittered(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// AwayStats returns how many of the store's marks of the resume (resume)
// failed because the database could not be reached, each one connection
// attempt, and how many operations failed at once meanwhile, with the last
// such mark's error, because its backoff had not run out.
func (s *Store) AwayStats() (failedMarks, pacedCalls int64) {
	return s.failedMarks.Load(), s.pacedCalls.Load()
}

// resume runs before every statement of the store (and at the start of every
// operation): after a statement failed because the database could not be
// reached, this replica saw an outage, during which holders could not renew
// their leases, so no statement may decide on a lease before the store is
// marked resumed (MarkResumed). The first caller marks; the others wait for
// that mark and then go on, or fail with its error when it failed (the flag
// stays set and the next operation marks again; after a mark that found the
// database unreachable, only once the backoff since, awayBackoff, ran out,
// and until then every operation fails at once with that mark's error,
// without connecting); a caller whose own context
// ended is no verdict on the database, so its waiters mark themselves, and
// neither is a mark that ran out of its own time (markTimeout): then the
// marking caller, while its context lasts, tries again like its waiters.
// The flag is cleared only by a mark that started after the last failure
// noted. A statement already on its way when the failure is noted is not
// held back: the window this leaves is one statement's flight, not the
// mark's. On Citus the same holds per worker (resumeNodes); resume is for
// operations on every worker's shards.
func (s *Store) resume(ctx context.Context) error {
	if s.citus {
		return dedupesvc.NotSent(s.resumeNodes(ctx, ""))
	}
	return dedupesvc.NotSent(s.resumeOne(ctx))
}

// resumeOne is resume on one PostgreSQL.
func (s *Store) resumeOne(ctx context.Context) error {
	for s.cutOff.Load() {
		s.resumeMu.Lock()
		if !s.cutOff.Load() {
			s.resumeMu.Unlock()
			return nil
		}
		if c := s.marking; c != nil {
			s.resumeMu.Unlock()
			s.markWaiting.Add(1)
			select {
			case <-c.done:
			case <-ctx.Done():
				s.markWaiting.Add(-1)
				return fmt.Errorf("pgstore: waiting for the store to be marked resumed: %w", ctx.Err())
			}
			s.markWaiting.Add(-1)
			if c.err != nil && !c.gaveUp {
				return c.err
			}
			continue
		}
		if s.awayErr != nil && time.Now().Before(s.awayUntil) {
			err := s.awayErr
			s.resumeMu.Unlock()
			s.pacedCalls.Add(1)
			return err
		}
		c := &markCall{done: make(chan struct{})}
		s.marking = c
		gen := s.cutGen
		markCtx, cancel := context.WithTimeout(ctx, markTimeout(s.markTimeouts))
		s.resumeMu.Unlock()
		err := s.MarkResumed(markCtx)
		timedOut := err != nil && markCtx.Err() != nil && ctx.Err() == nil
		cancel()
		s.resumeMu.Lock()
		s.marking = nil
		switch {
		case err == nil:
			s.markTimeouts = 0
			s.awayErr, s.awayDelay = nil, 0
			if s.cutGen == gen {
				s.cutOff.Store(false)
			}
		case timedOut:
			s.markTimeouts++
		case ctx.Err() == nil && cuts(ctx, err):
			s.failedMarks.Add(1)
			s.awayDelay = awayBackoff(s.awayDelay)
			s.awayErr, s.awayUntil = err, time.Now().Add(jittered(s.awayDelay))
		}
		c.err, c.gaveUp = err, err != nil && (timedOut || ctx.Err() != nil)
		close(c.done)
		s.resumeMu.Unlock()
		if err != nil && !timedOut {
			return err
		}
	}
	return nil
}

// noted returns err, first setting the cut-off flag when err says the
// database could not be reached, or that the connection reached a server
// that may no longer be written (a primary demoted by a failover that moved
// its DNS name): then it also drops the pool's connections, which would
// otherwise refuse every write until their maximum lifetime, so the next
// statement connects anew (to a writable server, given
// target_session_attrs=read-write), and holders get the resume's grace for
// the renewals refused meanwhile.
//
// On Citus the failure cuts off every worker (notedFor tells one).
func (s *Store) noted(ctx context.Context, err error) error {
	return s.notedOn(ctx, "", err)
}

// resumeFor is resume for an operation on the record id alone: on Citus it
// waits for the mark of the worker holding id's shard only.
func (s *Store) resumeFor(ctx context.Context, id dedupesvc.RecordID) error {
	if s.citus {
		return dedupesvc.NotSent(s.resumeNodes(ctx, id.Key))
	}
	return s.resume(ctx)
}

// notedFor is noted for a statement on the record id alone: on Citus, a
// coordinator that answered that it could not reach a worker (class 08)
// cuts off the worker holding id's shard only, the one whose holders'
// renewals may have failed too; anything else cuts off every worker.
func (s *Store) notedFor(ctx context.Context, id dedupesvc.RecordID, err error) error {
	return s.notedOn(ctx, id.Key, err)
}

// notedOn is noted, for a statement on the records of key ("" when on
// several).
func (s *Store) notedOn(ctx context.Context, key string, err error) error {
	if err == nil {
		return nil
	}
	if readOnlyServer(err) {
		s.pool.Reset()
	}
	if cuts(ctx, err) {
		group, one := int32(0), false
		if s.citus && key != "" && remoteNodeFailed(err) {
			if g, lookupErr := s.groupOfKey(ctx, key); lookupErr == nil {
				group, one = g, true
			}
		}
		s.resumeMu.Lock()
		s.cutGen++
		if s.citus {
			s.nodes.cut(group, one, s.cutGen)
		}
		s.cutOff.Store(true)
		s.resumeMu.Unlock()
	}
	return err
}

// cuts reports whether err cuts the replica off from the store (noted):
// the database could not be reached, or refused a write as read-only.
func cuts(ctx context.Context, err error) bool {
	return readOnlyServer(err) || unreachable(ctx, err)
}

// readOnlyServer reports whether err is a write refused because the server
// is read-only (SQLSTATE 25006, read_only_sql_transaction): a standby, or a
// primary that a failover demoted under the connection.
func readOnlyServer(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25006"
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
// later; its unknown retention is returned as kept (dedupesvc.Record.Expiry
// adds it).
var readSQL = `
SELECT fingerprint, state, attempt_token, epoch, outcome_type_url, outcome_value, outcome_key_id,
       CASE WHEN state = 'in_flight' THEN ` + leaseEnd("r") + ` ELSE lease_expires_at END,
       completed_at,
       CASE WHEN state = 'in_flight' THEN greatest(expires_at, ` + leaseEnd("r") + `) ELSE expires_at END,
       unknown_retention_ms, now()
FROM idemgate_records AS r
WHERE namespace = $3 AND scope = $1 AND idempotency_key = $2`

// expiry is the effective expiry of the row of alias t
// (dedupesvc.Record.Expiry): an in-flight row stays while its effective
// lease runs (a retention as short as the lease runs out with it during an
// outage) and, when its FAIL_CLOSED holder never stored an outcome, for its
// unknown_retention_ms past that lease's end, outcome-unknown. Every
// statement that treats a row as absent uses it.
func expiry(t string) string {
	return fmt.Sprintf(`(CASE WHEN %[1]s.state = 'in_flight'
        THEN greatest(%[1]s.expires_at, %[2]s + %[1]s.unknown_retention_ms * interval '1 millisecond')
        ELSE %[1]s.expires_at END)`, t, leaseEnd(t))
}

// nextEpoch is a new epoch, higher than every epoch the store handed out
// before to any key (migration 008), so no two reservations of a key ever
// share a fencing token, even after its record was swept.
const nextEpoch = `nextval('idemgate_epochs')`

// nextEpochOf is nextEpoch for a statement that updates the row aliased t:
// above the row's own epoch too. A replica not yet upgraded (a rolling
// deploy) writes its row's epoch + 1, which the sequence never sees, so the
// sequence alone could hand that key a lower, earlier epoch.
func nextEpochOf(t string) string {
	return fmt.Sprintf(`greatest(%s, %s.epoch + 1)`, nextEpoch, t)
}

// reserveSQL takes the key when it is free: no row, or a row that expired, or
// a row with the same fingerprint that was released or (under REEXECUTE,
// $7) whose holder's lease ran out. It returns nothing when the row blocks
// it. It repeats what decide checked, because only this statement's view of
// the row is atomic, with the effective lease end and expiry (leaseEnd,
// expiry). The epoch comes from the store's sequence (nextEpoch); $9 is the
// reservation's unknown retention (BeginParams.LostRetention).
var reserveSQL = `
INSERT INTO idemgate_records AS r (
    namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    retention_ms, lease_ms, unknown_retention_ms, lease_expires_at, expires_at)
VALUES (
    $8, $1, $2, $3, 'in_flight', $4, ` + nextEpoch + `,
    $6::bigint, $5::bigint, $9::bigint, now() + $5::bigint * interval '1 millisecond', now() + $6::bigint * interval '1 millisecond')
ON CONFLICT (namespace, scope, idempotency_key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    state = 'in_flight',
    attempt_token = excluded.attempt_token,
    epoch = ` + nextEpochOf("r") + `,
    retention_ms = excluded.retention_ms,
    lease_ms = excluded.lease_ms,
    unknown_retention_ms = excluded.unknown_retention_ms,
    outcome_type_url = NULL,
    outcome_value = NULL,
    outcome_key_id = NULL,
    lease_expires_at = excluded.lease_expires_at,
    expires_at = excluded.expires_at,
    created_at = now(),
    completed_at = NULL,
    -- A takeover keeps the duplicates waiting on the old holder: the new
    -- holder's outcome is what they wait for, so its change must notify.
    waiters = r.waiters AND r.state = 'in_flight'
WHERE ` + expiry("r") + ` <= now()
   OR (r.fingerprint = excluded.fingerprint
       AND (r.state = 'released'
            OR ($7::boolean AND r.state = 'in_flight' AND ` + leaseEnd("r") + ` <= now()
                AND r.attempt_token <> excluded.attempt_token)))
RETURNING epoch, lease_expires_at`

// firstSQL is Begin's first statement (dedupesvc.BeginSteps.First): it
// reads the key's row as readSQL does and, only when there is none and the
// namespace's quotas ($8 records, $9 outcome bytes; 0 is none) allow one
// more, inserts the reservation ($10 its unknown retention, as reserveSQL's
// $9); so a fresh key and a replay each cost one
// statement and one round trip. With a row found, the usage is not read and
// the INSERT gets no row to insert: a replay takes no row lock, gets no
// transaction ID and its commit flushes no WAL. Every sub-statement sees one
// snapshot: a row committed after it conflicts with the INSERT (ON CONFLICT
// DO NOTHING) yet is not read, and the statement returns neither; the
// caller then reads again (RunBegin).
var firstSQL = firstStatement(true)

// firstNoQuotaSQL is firstSQL for a Begin with no quota to check
// (BeginParams.MaxRecords and MaxOutcomeBytes 0: the quotas are off, or
// the Dedupe service found the caller far below them), without the usage
// CTE and its two parameters ($8 is the unknown retention). One text per
// form keeps each planned once: sent with zero quotas, firstSQL's custom
// plans (the usage CTE folded away) cost less than its generic plan, so
// PostgreSQL re-planned it on every call (TestFirstStatementIsPlannedOnce).
var firstNoQuotaSQL = firstStatement(false)

// firstStatement is firstSQL, with the quota check or without it.
func firstStatement(quota bool) string {
	usage, from, check, retention := `, usage AS (
    SELECT coalesce(sum(records), 0)::bigint AS records, coalesce(sum(outcome_bytes), 0)::bigint AS bytes
    FROM (`+namespaceUsage("$7")+`) AS u
    WHERE ($8::bigint > 0 OR $9::bigint > 0) AND NOT EXISTS (SELECT 1 FROM existing)
)`, `usage`, `
      AND ($8::bigint = 0 OR usage.records < $8::bigint) AND ($9::bigint = 0 OR usage.bytes < $9::bigint)`, `$10`
	if !quota {
		usage, from, check, retention = ``, `(SELECT 1) AS one`, ``, `$8`
	}
	return `
WITH existing AS (
    SELECT r.fingerprint, r.state, r.attempt_token, r.epoch, r.outcome_type_url, r.outcome_value, r.outcome_key_id,
           CASE WHEN r.state = 'in_flight' THEN ` + leaseEnd("r") + ` ELSE r.lease_expires_at END AS lease_end,
           r.completed_at,
           CASE WHEN r.state = 'in_flight' THEN greatest(r.expires_at, ` + leaseEnd("r") + `) ELSE r.expires_at END AS expiry,
           r.unknown_retention_ms
    FROM idemgate_records AS r
    WHERE r.namespace = $7 AND r.scope = $1 AND r.idempotency_key = $2
)` + usage + `, reserved AS (
    INSERT INTO idemgate_records AS r (
        namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
        retention_ms, lease_ms, unknown_retention_ms, lease_expires_at, expires_at)
    SELECT $7, $1, $2, $3, 'in_flight', $4, ` + nextEpoch + `,
        $6::bigint, $5::bigint, ` + retention + `::bigint, now() + $5::bigint * interval '1 millisecond', now() + $6::bigint * interval '1 millisecond'
    FROM ` + from + `
    WHERE NOT EXISTS (SELECT 1 FROM existing)` + check + `
    ON CONFLICT (namespace, scope, idempotency_key) DO NOTHING
    RETURNING epoch, lease_expires_at
)
SELECT reserved.epoch, reserved.lease_expires_at,
       existing.fingerprint, existing.state, existing.attempt_token, existing.epoch, existing.outcome_type_url,
       existing.outcome_value, existing.outcome_key_id, existing.lease_end, existing.completed_at, existing.expiry,
       existing.unknown_retention_ms, now()
FROM (SELECT 1) AS one
LEFT JOIN reserved ON true
LEFT JOIN existing ON true`
}

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

// namespaceUsage selects the usage rows of the namespace ns (a parameter)
// that a quota is checked against: its totals as compacted (CompactUsage),
// one row once migrated however many records it holds, and the changes the
// triggers appended since (migrations 005, 010 and 011), about one
// compaction interval's worth, through their namespace index. A compaction
// moves changes into the totals in one transaction, so one statement's
// snapshot sees each change once; what it cannot see are reservations
// committing at the same moment (MaxQuotaOvershoot).
func namespaceUsage(ns string) string {
	return `SELECT records, outcome_bytes FROM idemgate_namespace_usage WHERE namespace = ` + ns + `
    UNION ALL
    SELECT records, outcome_bytes FROM idemgate_usage_changes WHERE namespace = ` + ns
}

// usageSQL sums a namespace's usage (namespaceUsage).
var usageSQL = `
SELECT coalesce(sum(records), 0)::bigint, coalesce(sum(outcome_bytes), 0)::bigint
FROM (` + namespaceUsage("$1") + `) AS u`

// NamespaceUsage implements dedupesvc.UsageReader: the usage Begin's
// quota check reads (usageSQL), as one statement sees it. The Server reads
// it about once a second per busy namespace, so that a Begin far below its
// quotas skips that read: on one PostgreSQL it walks the namespace's changes
// not yet compacted, dead ones included until vacuumed; on Citus it reads
// every shard.
func (s *Store) NamespaceUsage(ctx context.Context, namespace string) (records, outcomeBytes int64, err error) {
	if err := s.noted(ctx, s.pool.QueryRow(ctx, s.q(usageSQL), namespace).Scan(&records, &outcomeBytes)); err != nil {
		return 0, 0, fmt.Errorf("pgstore: read usage: %w", err)
	}
	return records, outcomeBytes, nil
}

// MaxQuotaOvershoot bounds by how many records one replica's Begins may
// take a caller past its records quota (BeginParams.MaxRecords): a Begin
// counts the caller's compacted totals and its changes not yet compacted,
// all that has committed, so only reservations committing at the same
// moment are missed, and those are at most the statements in flight at
// once: Writers x MaxBatch with group commit (128 by default; a batch's
// statements see each other), else the pool's MaxConns. Across replicas
// the bounds add up.
func (s *Store) MaxQuotaOvershoot() int {
	if s.group != nil {
		return max(s.commit.Writers, 1) * s.commit.MaxBatch
	}
	return int(s.pool.Config().MaxConns)
}

// Begin implements dedupesvc.Store, through dedupesvc.RunBegin: it reads
// first, so a duplicate costs one read and no commit; only a free key is
// written, and then the single upsert decides who holds it.
func (s *Store) Begin(ctx context.Context, p dedupesvc.BeginParams) (dedupesvc.BeginResult, error) {
	if err := s.resumeFor(ctx, p.ID()); err != nil {
		return dedupesvc.BeginResult{}, err
	}
	// On Citus the reserving INSERT's extra parameters (citusForm) are read
	// beside the record, in its round trip (readWithExtras), so a fresh
	// key's Begin takes two round trips, not three; extras are the last
	// read's, nil before one.
	var extras []any
	steps := dedupesvc.BeginSteps{
		Read: func(ctx context.Context) (dedupesvc.Record, bool, time.Time, error) {
			if s.citus && !p.Peek {
				row, found, fetched, err := s.readWithExtras(ctx, p.ID(), s.q(reserveSQL))
				extras = fetched
				return row.Record, found, row.now, err
			}
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
			if err := s.resumeFor(ctx, p.ID()); err != nil {
				return time.Time{}, false, err
			}
			var until time.Time
			err := s.notedFor(ctx, p.ID(), s.pool.QueryRow(ctx, s.q(renewSQL), p.Scope, p.Key, p.AttemptToken, epoch, p.Lease.Milliseconds(), p.Namespace, p.ResolveOnly).Scan(&until))
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
			if err := s.noted(ctx, s.pool.QueryRow(ctx, s.q(usageSQL), p.Namespace).Scan(&records, &bytes)); err != nil {
				return 0, 0, fmt.Errorf("pgstore: read usage: %w", err)
			}
			return records, bytes, nil
		},
		Reserve: func(ctx context.Context, _ time.Time) (int64, time.Time, bool, error) {
			if err := s.resumeFor(ctx, p.ID()); err != nil {
				return 0, time.Time{}, false, err
			}
			var (
				epoch    int64
				leaseEnd time.Time
			)
			sql := s.q(reserveSQL)
			args := []any{
				p.Scope, p.Key, p.Fingerprint, p.AttemptToken, p.Lease.Milliseconds(), p.Retention.Milliseconds(),
				p.OnLostOutcome == dedupesvc.Reexecute, p.Namespace, p.LostRetention().Milliseconds(),
			}
			var err error
			if extras != nil {
				args = append(args, extras...)
			} else {
				args, err = s.citusExtraArgs(ctx, sql, args)
			}
			if err == nil {
				err = s.notedFor(ctx, p.ID(), s.pool.QueryRow(ctx, sql, args...).Scan(&epoch, &leaseEnd))
			}
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				return 0, time.Time{}, false, nil
			case err != nil:
				return 0, time.Time{}, false, fmt.Errorf("pgstore: reserve: %w", err)
			}
			return epoch, leaseEnd, true, nil
		},
	}
	// On Citus, no first statement without a quota: its usage CTE is
	// planned apart, across every shard, for every Begin. The read and the
	// reserving upsert each go to the one shard of the key. With a quota the
	// first statement stays: it is what bounds concurrent Begins' overshoot
	// (storetest RecordsQuotaConcurrent: without it 1000 of 1000 Begins
	// reserved against a quota of 200), at the cost of that fan-out.
	if !s.citus || p.MaxRecords > 0 || p.MaxOutcomeBytes > 0 {
		steps.First = func(ctx context.Context) (dedupesvc.FirstResult, error) {
			return s.first(ctx, p)
		}
	}
	res, err := dedupesvc.RunBegin(ctx, p, steps)
	// A step that reserves returns at once, so a Begin whose last step
	// could not even connect reserved nothing: it sent nothing that
	// counts (dedupesvc.ErrNotSent, as resume's own errors are).
	if connectErr := (*pgconn.ConnectError)(nil); errors.As(err, &connectErr) {
		err = dedupesvc.NotSent(err)
	}
	return res, err
}

// first runs firstSQL for p.
func (s *Store) first(ctx context.Context, p dedupesvc.BeginParams) (dedupesvc.FirstResult, error) {
	var (
		res                            dedupesvc.FirstResult
		epoch, recordEpoch             *int64
		leaseEnd, recordLease, expires *time.Time
		completedAt                    *time.Time
		state, token, typeURL, keyID   *string
		unknownMS                      *int64
	)
	r := &res.Record
	o := &op{order: orderOf(p.ID()), id: p.ID(), sql: s.q(firstSQL), args: []any{
		p.Scope, p.Key, p.Fingerprint, p.AttemptToken, p.Lease.Milliseconds(), p.Retention.Milliseconds(),
		p.Namespace, p.MaxRecords, p.MaxOutcomeBytes, p.LostRetention().Milliseconds(),
	}}
	if p.MaxRecords <= 0 && p.MaxOutcomeBytes <= 0 {
		o.sql = s.q(firstNoQuotaSQL)
		o.args = append(o.args[:7], p.LostRetention().Milliseconds())
	}
	o.scan = func(row pgx.Row) error {
		return row.Scan(&epoch, &leaseEnd, &r.Fingerprint, &state, &token, &recordEpoch, &typeURL, &r.Outcome.Value, &keyID,
			&recordLease, &completedAt, &expires, &unknownMS, &res.Now)
	}
	if err := s.run(ctx, o); err != nil {
		return dedupesvc.FirstResult{}, fmt.Errorf("pgstore: reserve or read: %w", err)
	}
	switch {
	case epoch != nil:
		res.Reserved, res.Epoch, res.LeaseExpiresAt = true, *epoch, *leaseEnd
	case state != nil:
		res.Found = true
		r.State, r.AttemptToken, r.Epoch, r.LeaseExpiresAt, r.ExpiresAt = *state, *token, *recordEpoch, *recordLease, *expires
		if typeURL != nil {
			r.Outcome.TypeURL = *typeURL
		}
		if keyID != nil {
			r.Outcome.KeyID = *keyID
		}
		if completedAt != nil {
			r.CompletedAt = *completedAt
		}
		if unknownMS != nil {
			r.UnknownRetention = time.Duration(*unknownMS) * time.Millisecond
		}
	}
	return res, nil
}

// record is one row as read by readSQL.
type record struct {
	dedupesvc.Record
	// now is the database's clock when the row was read.
	now time.Time
}

func (s *Store) read(ctx context.Context, id dedupesvc.RecordID) (record, bool, error) {
	if err := s.resumeFor(ctx, id); err != nil {
		return record{}, false, err
	}
	return s.scanRead(ctx, id, s.pool.QueryRow(ctx, s.q(readSQL), id.Scope, id.Key, id.Namespace))
}

// scanRead reads readSQL's row, noting its failure.
func (s *Store) scanRead(ctx context.Context, id dedupesvc.RecordID, r pgx.Row) (record, bool, error) {
	var (
		row         record
		typeURL     *string
		keyID       *string
		completedAt *time.Time
		unknownMS   int64
	)
	err := s.notedFor(ctx, id, r.Scan(
		&row.Fingerprint, &row.State, &row.AttemptToken, &row.Epoch, &typeURL, &row.Outcome.Value, &keyID,
		&row.LeaseExpiresAt, &completedAt, &row.ExpiresAt, &unknownMS, &row.now))
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
	row.UnknownRetention = time.Duration(unknownMS) * time.Millisecond
	return row, true, nil
}

// finishSQL stores the outcome if the attempt still holds the reservation
// (in flight, or marked unknown after its lease ran out: the real outcome
// settles it, unless $13, ResolveOnly), and restarts the retention from now.
// When the namespace's stored bytes (its compacted total) plus the
// outcome's would be over the quota $9, it stores the marker ($10-$12) in
// its place: the check and the write are one statement, so no Finish sees
// a total another Finish's statement has not yet left (the totals trail by
// one compaction, see CompactUsage).
var finishSQL = `
UPDATE idemgate_records AS r
SET state = 'completed',
    outcome_type_url = CASE WHEN q.fits THEN $5 ELSE $10 END,
    outcome_value = CASE WHEN q.fits THEN $6::bytea ELSE $11::bytea END,
    outcome_key_id = CASE WHEN q.fits THEN $8 ELSE $12 END,
    completed_at = now(),
    expires_at = now() + r.retention_ms * interval '1 millisecond'
FROM (SELECT $9::bigint = 0 OR $11::bytea IS NULL
          OR coalesce((SELECT sum(outcome_bytes) FROM idemgate_namespace_usage WHERE namespace = $7), 0)
             + octet_length($6::bytea) <= $9::bigint AS fits) AS q
WHERE r.namespace = $7 AND r.scope = $1 AND r.idempotency_key = $2 AND r.attempt_token = $3 AND r.epoch = $4
  AND (r.state = 'in_flight' OR (r.state = 'unknown' AND NOT $13::boolean))`

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
	_, err := s.FinishWithinQuota(ctx, p)
	return err
}

// FinishWithinQuota implements dedupesvc.QuotaFinisher.
func (s *Store) FinishWithinQuota(ctx context.Context, p dedupesvc.FinishParams) (bool, error) {
	if err := s.resumeFor(ctx, p.ID()); err != nil {
		return false, err
	}
	var (
		markerURL   *string
		markerValue []byte
		markerKey   *string
	)
	if m := p.OverQuota; m != nil {
		markerURL, markerValue, markerKey = &m.TypeURL, m.Value, keyIDParam(m.KeyID)
		if markerValue == nil {
			markerValue = []byte{}
		}
	}
	args := []any{p.Scope, p.Key, p.AttemptToken, p.Epoch, p.Outcome.TypeURL, p.Outcome.Value, p.Namespace, keyIDParam(p.Outcome.KeyID),
		p.MaxOutcomeBytes, markerURL, markerValue, markerKey, p.ResolveOnly}
	if s.channel != "" && !s.citus {
		args = append(args, s.channel, NotifyID(p.ID()))
	}
	var (
		n           int
		fits, woken bool
	)
	scan := func(row pgx.Row) error { return row.Scan(&n, &fits) }
	if s.citus {
		scan = func(row pgx.Row) error { return row.Scan(&n, &fits, &woken) }
	}
	if err := s.run(ctx, &op{order: orderOf(p.ID()), id: p.ID(), sql: s.finishSQL, args: args, scan: scan}); err != nil {
		return false, fmt.Errorf("pgstore: finish: %w", err)
	}
	s.notifyAfter(ctx, woken, NotifyID(p.ID()))
	if n == 1 {
		return !fits, nil
	}
	row, found, err := s.holder(ctx, p.ID())
	if err != nil {
		return false, err
	}
	return false, dedupesvc.RefusedFinish(row, found, p)
}

// holderSQL reads who holds a record, and nothing of its outcome.
const holderSQL = `
SELECT state, attempt_token, epoch FROM idemgate_records
WHERE namespace = $3 AND scope = $1 AND idempotency_key = $2`

// holder reads a record's state, token and epoch (holderSQL).
func (s *Store) holder(ctx context.Context, id dedupesvc.RecordID) (dedupesvc.Record, bool, error) {
	if err := s.resumeFor(ctx, id); err != nil {
		return dedupesvc.Record{}, false, err
	}
	var r dedupesvc.Record
	err := s.notedFor(ctx, id, s.pool.QueryRow(ctx, s.q(holderSQL), id.Scope, id.Key, id.Namespace).Scan(&r.State, &r.AttemptToken, &r.Epoch))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return dedupesvc.Record{}, false, nil
	case err != nil:
		return dedupesvc.Record{}, false, fmt.Errorf("pgstore: read holder: %w", err)
	}
	return r, true, nil
}

// CheckFinish implements dedupesvc.FinishChecker: one read by primary key,
// outside the group commit, that sends no outcome.
func (s *Store) CheckFinish(ctx context.Context, p dedupesvc.FinishParams) (bool, error) {
	r, found, err := s.holder(ctx, p.ID())
	if err != nil {
		return false, err
	}
	return dedupesvc.HeldForFinish(r, found, p)
}

// releaseSQL frees the reservation if the attempt still holds it.
const releaseSQL = `
UPDATE idemgate_records
SET state = 'released', lease_expires_at = now()
WHERE namespace = $5 AND scope = $1 AND idempotency_key = $2 AND attempt_token = $3 AND epoch = $4
  AND (state = 'in_flight' OR (state = 'unknown' AND NOT $6::boolean))`

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
	if err := s.resumeFor(ctx, p.ID()); err != nil {
		return err
	}
	var (
		n   int
		err error
	)
	if p.OutcomeUnknown {
		n, err = s.change(ctx, s.releaseUnknownSQL, p.ID(), p.Scope, p.Key, p.AttemptToken, p.Epoch, p.UnknownRetention.Milliseconds(), p.Namespace)
	} else {
		n, err = s.change(ctx, s.releaseSQL, p.ID(), p.Scope, p.Key, p.AttemptToken, p.Epoch, p.Namespace, p.ResolveOnly)
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

// releaseLostSQL frees a record held by an attempt whose Begin's answer
// was lost (ReleaseLost): releaseSQL whatever the epoch, which that attempt
// never learnt. Its token alone names the reservation: tokens are unique
// per attempt, and Resolve, the only step that gives an attempt's record a
// new epoch, settles it.
const releaseLostSQL = `
UPDATE idemgate_records
SET state = 'released', lease_expires_at = now()
WHERE namespace = $4 AND scope = $1 AND idempotency_key = $2 AND attempt_token = $3
  AND (state = 'in_flight' OR (state = 'unknown' AND NOT $5::boolean))`

// ReleaseLost implements dedupesvc.Store: every attempt's releaseLostSQL in
// one pgx.Batch, one round trip and one commit, sorted by record as a
// group commit is, so it cannot deadlock with one. If the batch fails for
// another reason than an unreachable store, each statement runs alone, and
// the error names the first that failed. On Citus each runs alone
// (releaseLostEach).
func (s *Store) ReleaseLost(ctx context.Context, p dedupesvc.ReleaseLostParams) (int, error) {
	if s.citus {
		return s.releaseLostEach(ctx, p)
	}
	if err := s.resume(ctx); err != nil {
		return 0, err
	}
	attempts := slices.Clone(p.Attempts)
	slices.SortStableFunc(attempts, func(a, b dedupesvc.LostAttempt) int {
		return strings.Compare(orderOf(dedupesvc.RecordID{Scope: a.Scope, Key: a.Key}), orderOf(dedupesvc.RecordID{Scope: b.Scope, Key: b.Key}))
	})
	ops := make([]*op, len(attempts))
	woken := make([]bool, len(attempts))
	changed := make([]int, len(attempts))
	for i, a := range attempts {
		id := dedupesvc.RecordID{Namespace: p.Namespace, Scope: a.Scope, Key: a.Key}
		args := []any{a.Scope, a.Key, a.AttemptToken, p.Namespace, p.ResolveOnly}
		scan := func(row pgx.Row) error { return row.Scan(&changed[i]) }
		if s.citus {
			scan = func(row pgx.Row) error { return row.Scan(&changed[i], &woken[i]) }
		} else if s.channel != "" {
			args = append(args, s.channel, NotifyID(id))
		}
		ops[i] = &op{sql: s.releaseLostSQL, args: args, scan: scan}
	}
	b := &pgx.Batch{}
	for _, o := range ops {
		b.Queue(o.sql, o.args...).QueryRow(o.scan)
	}
	err := s.pool.SendBatch(ctx, b).Close()
	if err != nil {
		// Rolled back: nothing the batch's statements answered holds.
		clear(changed)
		clear(woken)
	}
	if err != nil && ctx.Err() == nil && !unreachable(ctx, err) {
		err = nil
		for _, o := range ops {
			if alone := o.scan(s.pool.QueryRow(ctx, o.sql, o.args...)); alone != nil && err == nil {
				err = alone
			}
		}
	}
	released := 0
	for i, a := range attempts {
		released += changed[i]
		s.notifyAfter(ctx, woken[i], NotifyID(dedupesvc.RecordID{Namespace: p.Namespace, Scope: a.Scope, Key: a.Key}))
	}
	if err != nil {
		return released, fmt.Errorf("pgstore: release lost Begins: %w", s.noted(ctx, err))
	}
	return released, nil
}

// releaseLostEach is ReleaseLost on Citus: each statement alone, on its
// key's worker once that worker's resume mark is made (change), so a
// worker away fails only its own keys' and the others are freed; the error
// names the first that failed.
func (s *Store) releaseLostEach(ctx context.Context, p dedupesvc.ReleaseLostParams) (int, error) {
	released := 0
	var first error
	for _, a := range p.Attempts {
		id := dedupesvc.RecordID{Namespace: p.Namespace, Scope: a.Scope, Key: a.Key}
		n, err := s.change(ctx, s.releaseLostSQL, id, a.Scope, a.Key, a.AttemptToken, p.Namespace, p.ResolveOnly)
		released += n
		if err != nil && first == nil {
			first = fmt.Errorf("pgstore: release lost Begins: %w", err)
		}
	}
	return released, first
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
  AND (state = 'in_flight' OR (state = 'unknown' AND NOT $7::boolean))
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
  AND (state = 'in_flight' OR (state = 'unknown' AND NOT $7::boolean))
RETURNING lease_expires_at`

// Heartbeat implements dedupesvc.Store.
func (s *Store) Heartbeat(ctx context.Context, p dedupesvc.HeartbeatParams) (time.Time, error) {
	if err := s.resumeFor(ctx, p.ID()); err != nil {
		return time.Time{}, err
	}
	var until time.Time
	err := s.notedFor(ctx, p.ID(), s.pool.QueryRow(ctx, s.q(heartbeatSQL), p.Scope, p.Key, p.AttemptToken, p.Epoch, p.Lease.Milliseconds(), p.Namespace, p.ResolveOnly).Scan(&until))
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
// called with the key since), and not expired (expiry). Its namespace is parameter
// $ns.
func unknownWhere(ns int) string {
	return fmt.Sprintf(`
WHERE namespace = $%d AND scope = $1 AND idempotency_key = $2 AND %s > now()
  AND (state = 'unknown' OR (state = 'in_flight' AND %s <= now()))`, ns, expiry("r"), leaseEnd("r"))
}

// resolveCompleteSQL and resolveReleaseSQL settle an unknown record. Both
// give it a new epoch (nextEpochOf), which fences the attempt that held it: its late Finish,
// Release or Heartbeat gets ErrNotHeld instead of being taken for a retry
// of its own that already took effect, so its outcome never silently
// disappears.
var resolveCompleteSQL = `
UPDATE idemgate_records AS r
` + completeSet(3, 4, 6) + `,
    epoch = ` + nextEpochOf("r") + unknownWhere(5)

var resolveReleaseSQL = `
UPDATE idemgate_records AS r
SET state = 'released', lease_expires_at = now(), epoch = ` + nextEpochOf("r") + unknownWhere(3)

// Resolve implements dedupesvc.Store.
func (s *Store) Resolve(ctx context.Context, p dedupesvc.ResolveParams) error {
	if err := s.resumeFor(ctx, p.ID()); err != nil {
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
// through the expires_at index. The batch is chosen among deletable rows
// only (expiry): a row past its expires_at that must stay (in flight within
// its effective lease, or a dead FAIL_CLOSED holder's within its unknown
// retention) is passed over, never counted against the LIMIT, or such rows
// ahead of deletable ones would fill every batch and the sweep would delete
// nothing. The outer test re-checks each row, so a row reserved anew between
// the two scans survives. An in-flight row of a FAIL_CLOSED holder deleted
// here was outcome-unknown to the end, and is reported as such. Rows another
// transaction holds are skipped (SKIP LOCKED), left for the next sweep: the
// DELETE takes its rows in expiry order, a batch takes its own in key order,
// and a sweep that waited for a batch's row while holding one the batch
// needs next would deadlock with it.
var deleteExpiredSQL = `
DELETE FROM idemgate_records AS r
WHERE (namespace, scope, idempotency_key) IN (
    SELECT c.namespace, c.scope, c.idempotency_key FROM idemgate_records AS c
    WHERE c.expires_at <= now() AND ` + expiry("c") + ` <= now()
    ORDER BY c.expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
  AND ` + expiry("r") + ` <= now()
RETURNING namespace, scope, idempotency_key, state = 'unknown' OR (state = 'in_flight' AND unknown_retention_ms > 0)`

// DeleteExpired implements dedupesvc.Store.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, []dedupesvc.RecordID, error) {
	if err := s.resume(ctx); err != nil {
		return 0, nil, err
	}
	if s.citus {
		return s.citusDeleteExpired(ctx, limit)
	}
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

// lostCandidatesSQL finds in-flight rows of FAIL_CLOSED holders whose
// effective lease ended at least one more lease ago (lostAfter), oldest
// first, through the partial index of migration 009: its entries are the
// FAIL_CLOSED calls in flight, so a REEXECUTE row, however many lie dead,
// is never read. It reads, and locks nothing.
var lostCandidatesSQL = `
SELECT c.namespace, c.scope, c.idempotency_key, c.epoch FROM idemgate_records AS c
WHERE c.state = 'in_flight' AND c.unknown_retention_ms > 0 AND ` + lostAfter("c") + ` <= now()
ORDER BY c.created_at
LIMIT $1`

// lostAfter is when the sweeper marks the row aliased t: one full lease
// (lease_ms) past its effective lease's end. A Begin already treats the
// record as outcome-unknown from that end; the sweeper, which marks for
// operators without anyone asking, gives a holder that lost its renewals
// for a moment (a partition, a reconnect after a restart) one more lease to
// come back before it is listed as dead.
func lostAfter(t string) string {
	return fmt.Sprintf(`(%s + %s.lease_ms * interval '1 millisecond')`, leaseEnd(t), t)
}

// markLostSQL marks one such row outcome-unknown, if it still is that
// in-flight epoch past lostAfter, kept for its unknown retention past its
// lease's end. One row per statement: it takes one row lock and waits for
// no other, so it cannot deadlock with group-commit batches.
var markLostSQL = `
UPDATE idemgate_records AS r
SET state = 'unknown',
    expires_at = greatest(expires_at, ` + leaseEnd("r") + ` + unknown_retention_ms * interval '1 millisecond')
WHERE namespace = $1 AND scope = $2 AND idempotency_key = $3 AND epoch = $4
  AND state = 'in_flight' AND unknown_retention_ms > 0 AND ` + lostAfter("r") + ` <= now()`

// MarkLostOutcomes implements dedupesvc.LostOutcomeMarker.
func (s *Store) MarkLostOutcomes(ctx context.Context, limit int) (int, error) {
	if err := s.resume(ctx); err != nil {
		return 0, err
	}
	rows, err := s.pool.Query(ctx, s.q(lostCandidatesSQL), limit)
	if err = s.noted(ctx, err); err != nil {
		return 0, fmt.Errorf("pgstore: find lost outcomes: %w", err)
	}
	type candidate struct {
		id    dedupesvc.RecordID
		epoch int64
	}
	var c candidate
	found, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (candidate, error) {
		err := row.Scan(&c.id.Namespace, &c.id.Scope, &c.id.Key, &c.epoch)
		return c, err
	})
	if err = s.noted(ctx, err); err != nil {
		return 0, fmt.Errorf("pgstore: find lost outcomes: %w", err)
	}
	marked := 0
	for _, c := range found {
		n, err := s.change(ctx, s.markLostSQL, c.id, c.id.Namespace, c.id.Scope, c.id.Key, c.epoch)
		if err != nil {
			return marked, fmt.Errorf("pgstore: mark lost outcome: %w", err)
		}
		marked += n
	}
	// A candidate that changed meanwhile is not counted: the sweeper may
	// stop short and marks the rest at its next sweep.
	return marked, nil
}

// keyIDParam is an outcome's key id as a parameter: NULL for a plaintext
// outcome, so the column tells sealed rows from plaintext ones.
func keyIDParam(id string) *string {
	if id == "" {
		return nil
	}
	return &id
}

// compactLockSQL takes the compaction row, or nothing when another replica's
// compaction holds it: that replica moves the same changes, so this one
// skips the round instead of queueing behind it.
const compactLockSQL = `SELECT id FROM idemgate_usage_compaction FOR UPDATE SKIP LOCKED`

// compactRowSQL makes sure the compaction row exists; it writes nothing
// when it does.
const compactRowSQL = `INSERT INTO idemgate_usage_compaction (id) VALUES (true) ON CONFLICT (id) DO NOTHING`

// compactUsageSQL moves every change the usage triggers appended (migration
// 010) into the namespaces' totals, in one statement: a change is deleted in
// the transaction that adds it, so it counts exactly once. Changes committed
// after the statement's snapshot stay for the next compaction. The totals
// are written in namespace order; only compactions write them, one at a
// time (compactLockSQL).
const compactUsageSQL = `
WITH moved AS (
    DELETE FROM idemgate_usage_changes RETURNING namespace, records, outcome_bytes
), summed AS (
    INSERT INTO idemgate_namespace_usage AS u (namespace, shard, records, outcome_bytes)
    SELECT namespace, 0, sum(records), sum(outcome_bytes) FROM moved GROUP BY namespace ORDER BY namespace
    ON CONFLICT (namespace, shard) DO UPDATE
    SET records = u.records + excluded.records, outcome_bytes = u.outcome_bytes + excluded.outcome_bytes
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM summed)`

// usageLagSQL is a compaction round's first statement, outside any
// transaction: the age in seconds of the oldest change waiting (migration
// 012's changed_at), NULL when none waits. It reads the small changes table
// (about one interval's changes) and takes no row lock, so a round with
// nothing to move costs every replica this one read, not a write
// transaction queueing on the compaction row.
const usageLagSQL = `SELECT extract(epoch FROM now() - min(changed_at))::float8 FROM idemgate_usage_changes`

// CompactUsage implements dedupesvc.UsageCompactor: it adds the usage
// changes recorded since the last compaction to the namespaces' totals that
// Begin checks the quotas against, and returns how many changes it moved (0
// when none waited, or when another replica was compacting at that moment).
// A quota is enforced against the totals as of the last compaction, so a
// caller may overshoot it by what it reserves between two compactions.
func (s *Store) CompactUsage(ctx context.Context) (int64, error) {
	moved, _, err := s.CompactUsageLag(ctx)
	return moved, err
}

// CompactUsageLag implements dedupesvc.UsageLagCompactor: CompactUsage,
// also returning the age of the oldest change that waited when the round
// began (0 when none did; the round then takes no lock and writes nothing).
func (s *Store) CompactUsageLag(ctx context.Context) (moved int64, lag time.Duration, err error) {
	if err := s.resume(ctx); err != nil {
		return 0, 0, err
	}
	var age *float64
	if err := s.pool.QueryRow(ctx, usageLagSQL).Scan(&age); err != nil {
		return 0, 0, fmt.Errorf("pgstore: compact usage: %w", s.noted(ctx, err))
	}
	if age == nil {
		return 0, 0, nil
	}
	// A change stamped by a transaction that began before the store's clock
	// stepped back, or one committing just now: never a negative age.
	lag = max(time.Duration(*age*float64(time.Second)), 0)
	err = retrySerialization(ctx, func() error { return s.compactOnce(ctx, &moved) })
	if err != nil {
		return 0, lag, fmt.Errorf("pgstore: compact usage: %w", s.noted(ctx, err))
	}
	if s.usageVacuumEvery > 0 && s.usageMoved.Add(moved) >= s.usageVacuumEvery {
		s.usageMoved.Store(0)
		s.vacuumUsage(ctx)
	}
	return moved, lag, nil
}

// usageVacuumAllowedSQL says whether this role may vacuum the usage
// changes: PostgreSQL lets the table's owner (or a member of its role, or
// a superuser) do it.
const usageVacuumAllowedSQL = `SELECT coalesce(pg_has_role(c.relowner, 'USAGE'), false) FROM pg_class AS c WHERE c.oid = to_regclass('idemgate_usage_changes')`

// usageVacuumSQL vacuums the usage changes unless another vacuum (such as
// autovacuum's) holds the table: compactions delete every change they move,
// and only a vacuum frees the space (pruning a page does not make it
// reusable), so without one a round's scan grows with every change since.
const usageVacuumSQL = `VACUUM (SKIP_LOCKED) idemgate_usage_changes`

// vacuumUsage vacuums idemgate_usage_changes when this role may. A role
// that may not (a runtime role that does not own the schema, as
// docs/operating.md sets up), or a database without VACUUM, leaves it to
// autovacuum: once the database says so, the replica never asks again. A
// failure for want of the database (a reset connection, a restart, a
// timeout) is tried again at the next threshold. A failure is not the
// compaction's: its changes are moved.
func (s *Store) vacuumUsage(ctx context.Context) {
	if s.usageVacuum.Load() == 0 {
		var allowed bool
		switch err := s.pool.QueryRow(ctx, usageVacuumAllowedSQL).Scan(&allowed); {
		case err != nil:
			if vacuumRefused(err) {
				s.usageVacuum.Store(-1)
			}
			return
		case !allowed:
			s.usageVacuum.Store(-1)
			return
		}
		s.usageVacuum.Store(1)
	}
	if s.usageVacuum.Load() < 0 {
		return
	}
	if _, err := s.pool.Exec(ctx, usageVacuumSQL, pgx.QueryExecModeSimpleProtocol); err != nil {
		if vacuumRefused(err) {
			s.usageVacuum.Store(-1)
		}
		return
	}
	s.usageVacuums.Add(1)
}

// vacuumRefused says whether err is the database refusing the usage vacuum
// for good: no privilege, or no such statement or feature (SQLSTATE classes
// 42 and 0A). Any other error (the connection, a restart, a timeout, the
// server short of resources) may pass.
func vacuumRefused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "42") || strings.HasPrefix(pgErr.Code, "0A")
}

// UsageVacuums returns how many times compaction vacuumed the usage
// changes (WithUsageVacuumEvery), and whether this store's role may: false
// also before the first try.
func (s *Store) UsageVacuums() (vacuums int64, allowed bool) {
	return s.usageVacuums.Load(), s.usageVacuum.Load() > 0
}

// retrySerialization runs fn again, up to twice, when it fails with a
// serialization failure (40001): PostgreSQL's READ COMMITTED compaction
// never does, but under SERIALIZABLE (CockroachDB) a compaction racing the
// triggers' inserts may, and its next try moves the same changes again.
func retrySerialization(ctx context.Context, fn func() error) error {
	var err error
	for range 3 {
		var pgErr *pgconn.PgError
		if err = fn(); !errors.As(err, &pgErr) || pgErr.Code != "40001" || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// compactOnce is one try of CompactUsage, its changes moved counted in
// moved.
func (s *Store) compactOnce(ctx context.Context, moved *int64) error {
	*moved = 0
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Recreated if someone deleted it: without the row no replica
		// would ever compact, and the quotas would stop seeing new usage.
		if _, err := tx.Exec(ctx, s.q(compactRowSQL)); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, s.q(compactLockSQL))
		if err != nil {
			return err
		}
		locked := rows.Next()
		rows.Close()
		if err := rows.Err(); err != nil || !locked {
			return err
		}
		var namespaces int64
		return tx.QueryRow(ctx, s.q(compactUsageSQL)).Scan(moved, &namespaces)
	})
}

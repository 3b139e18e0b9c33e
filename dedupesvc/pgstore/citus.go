package pgstore

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc"
)

// WithCitus runs the Store on the coordinator of a Citus cluster whose
// schema migration 013 distributed (docs/operating.md, "When one primary
// is not enough"). Defaults to off: plain PostgreSQL. It selects the
// Citus-safe forms of the statements that differ:
//
//   - A time plus milliseconds of a column is idemgate_plus_ms (migration
//     013), not timestamptz + interval, which is STABLE, and Citus refuses
//     STABLE functions of columns in UPDATE and DELETE.
//   - NOTIFY is sent from the coordinator, in a statement of its own after
//     the change committed, when the change found the waiters flag set: in
//     the change's statement pg_notify would run on the worker holding the
//     shard, whose notifications no Listener on the coordinator receives.
//     A hint lost by a crash between the two costs a waiter its next poll,
//     as any lost notification does.
//   - The sweeper picks expired rows across the shards first and deletes
//     each by its key, re-checking its expiry: Citus runs no FOR UPDATE
//     SKIP LOCKED subquery across shards. One row per statement takes one
//     row lock and waits for no other, so it cannot deadlock.
//   - Replay counts are added one record per statement, in key order, in
//     one transaction, each on its own shard.
//   - Group commit is off: a batch of statements on keys of different
//     workers would be one distributed transaction, committed with two-phase
//     commit on each worker, dearer than the commits it shares.
//
// The sequence idemgate_epochs lives on the coordinator, which evaluates
// nextval before it sends a statement to its shard, so epochs stay unique
// across the cluster.
func WithCitus() Option {
	return func(s *Store) { s.citus = true }
}

// DetectCitus reports whether the database at pool is a Citus cluster's
// coordinator whose schema is distributed (migration 013 ran with the
// citus extension installed), so the Store must run WithCitus.
func DetectCitus(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	_, distributed, err := citusState(ctx, pool)
	return distributed, err
}

// IsCitus reports whether the Store runs the Citus forms (WithCitus).
func (s *Store) IsCitus() bool { return s.citus }

// q returns sql as the Store runs it: unchanged on plain PostgreSQL, its
// Citus form (citusForm) with WithCitus, computed once per statement.
func (s *Store) q(sql string) string {
	if !s.citus {
		return sql
	}
	s.citusMu.Lock()
	defer s.citusMu.Unlock()
	if out, ok := s.citusForms[sql]; ok {
		return out
	}
	out, extra := citusForm(sql)
	s.citusForms[sql] = out
	if len(extra) > 0 {
		s.citusExtra[out] = extra
	}
	return out
}

// citusExtraArgs appends to args the extra parameters sql's Citus form
// takes (citusForm), each read by its query on the coordinator; args
// unchanged for any other statement. An epoch drawn for an UPDATE that
// then changes no row is skipped: epochs need only be unique and grow.
func (s *Store) citusExtraArgs(ctx context.Context, sql string, args []any) ([]any, error) {
	if !s.citus {
		return args, nil
	}
	s.citusMu.Lock()
	extra := s.citusExtra[sql]
	s.citusMu.Unlock()
	if len(extra) == 0 {
		return args, nil
	}
	values := make([]any, len(extra))
	dest := make([]any, len(extra))
	for i := range values {
		dest[i] = &values[i]
	}
	if err := s.pool.QueryRow(ctx, "SELECT "+strings.Join(extra, ", ")).Scan(dest...); err != nil {
		return nil, s.noted(ctx, err)
	}
	return append(args, values...), nil
}

// readWithExtras is read with the extra parameters of sql's Citus form
// (citusExtraArgs) read in the same round trip, one pgx.Batch; extras is
// nil when sql takes none. Read with the record, the coordinator's now()
// and resume time are at most one round trip older when sql runs than
// citusExtraArgs's would be: an INSERT's lease then starts and ends that
// much earlier, and its takeover judges a lease run out that much later,
// both on the holder's side; the shard's own resume mark is read in sql.
func (s *Store) readWithExtras(ctx context.Context, id dedupesvc.RecordID, sql string) (record, bool, []any, error) {
	if err := s.resumeFor(ctx, id); err != nil {
		return record{}, false, nil, err
	}
	s.citusMu.Lock()
	extra := s.citusExtra[sql]
	s.citusMu.Unlock()
	b := &pgx.Batch{}
	var (
		row   record
		found bool
		err   error
	)
	b.Queue(s.q(readSQL), id.Scope, id.Key, id.Namespace).QueryRow(func(r pgx.Row) error {
		row, found, err = s.scanRead(ctx, id, r)
		return err
	})
	var values []any
	if len(extra) > 0 {
		values = make([]any, len(extra))
		dest := make([]any, len(extra))
		for i := range values {
			dest[i] = &values[i]
		}
		b.Queue("SELECT " + strings.Join(extra, ", ")).QueryRow(func(r pgx.Row) error {
			return r.Scan(dest...)
		})
	}
	if batchErr := s.pool.SendBatch(ctx, b).Close(); batchErr != nil {
		if err == nil {
			err = fmt.Errorf("pgstore: read record: %w", s.notedFor(ctx, id, batchErr))
		}
		return record{}, false, nil, err
	}
	return row, found, values, nil
}

// msSuffix ends every addition of milliseconds in the statements.
const msSuffix = ` * interval '1 millisecond'`

// citusForm is sql in the forms Citus accepts in UPDATE, DELETE and INSERT
// on distributed tables, by the functions of migration 013, each giving
// what the plain form gives:
//
//   - "a + b * interval '1 millisecond'" becomes "idemgate_plus_ms(a, b)",
//     IMMUTABLE where timestamptz + interval is STABLE; a is a token or a
//     parenthesised expression, optionally a function call; b a token.
//   - The server's start in a lease's grace (leaseEnd),
//     "idemgate_plus_ms(pg_postmaster_start_time(), t.lease_ms)", is
//     followed by "idemgate_server_start_plus_ms(t.lease_ms)" (migration
//     014): the start of the worker holding the row, evaluated there. Citus
//     evaluates pg_postmaster_start_time() on the coordinator in UPDATE and
//     DELETE, and it is the coordinator's parameter in INSERT (below), so
//     alone it gave no grace after a worker's restart, which cuts off the
//     holders on that worker's shards as a restart of one PostgreSQL cuts
//     off every holder. Both count: the coordinator's restart cuts off every
//     holder. The worker's own start rather than the latest start across
//     the nodes: it is read in the statement, where the row is, for no round
//     trip and no cache that could miss a restart; and a worker's restart
//     delays takeovers on its shards only. (A shard moved to another worker
//     within a lease of its old worker's restart loses that grace.)
//   - With them, "idemgate_shard_resumed_plus_ms(t.idempotency_key,
//     t.lease_ms)" (migration 015): the resume mark of the row's shard,
//     read on the worker holding it, which a replica that saw that worker
//     unreachable writes there alone (resumeNodes); the store-wide mark,
//     still read, is a write on every node.
//   - "CASE WHEN c THEN a ELSE b END" becomes "idemgate_case(c, a, b)":
//     Citus refuses a CASE holding a STABLE function such as now().
//   - The epoch of an UPDATE, "greatest(nextval('idemgate_epochs'), ",
//     takes the sequence's next value as one more parameter: Citus refuses
//     VOLATILE functions in UPDATE.
//   - In an INSERT into the records, "(SELECT resumed_at FROM
//     idemgate_store_state)", pg_postmaster_start_time() and now() are
//     parameters more, read on the coordinator just before: Citus refuses
//     subqueries in INSERT, and STABLE functions in its ON CONFLICT. (In UPDATE and SELECT a
//     subquery on that reference table runs on the shard's worker, which
//     holds a copy.) Only Begin's takeover (reserveSQL) is such an INSERT.
//
// It returns the extra parameters in the order they are appended
// (citusExtraArgs).
func citusForm(sql string) (string, []string) {
	var extra []string
	for {
		end := strings.Index(sql, msSuffix)
		if end < 0 {
			break
		}
		rStart := end
		for rStart > 0 && isToken(sql[rStart-1]) {
			rStart--
		}
		if !strings.HasSuffix(sql[:rStart], " + ") || rStart == end {
			panic(fmt.Sprintf("pgstore: no a + b before %q in %s", msSuffix, sql))
		}
		lEnd := rStart - len(" + ")
		lStart := lEnd
		if sql[lStart-1] == ')' {
			depth := 0
			for lStart > 0 {
				lStart--
				switch sql[lStart] {
				case ')':
					depth++
				case '(':
					depth--
				}
				if depth == 0 {
					break
				}
			}
		}
		for lStart > 0 && isToken(sql[lStart-1]) {
			lStart--
		}
		sql = sql[:lStart] + "idemgate_plus_ms(" + sql[lStart:lEnd] + ", " + sql[rStart:end] + ")" + sql[end+len(msSuffix):]
	}
	sql = serverStartOfLease.ReplaceAllString(sql, "$0, idemgate_server_start_plus_ms($1.lease_ms), idemgate_shard_resumed_plus_ms($1.idempotency_key, $1.lease_ms)")
	sql = rewriteCases(sql)
	if strings.Contains(sql, nextEpochInUpdate) {
		extra = append(extra, extraEpoch)
		sql = strings.ReplaceAll(sql, nextEpochInUpdate, fmt.Sprintf("greatest($%d::bigint, ", maxParam(sql)+1))
	}
	if strings.HasPrefix(strings.TrimSpace(sql), "INSERT INTO idemgate_records") {
		if strings.Contains(sql, resumedAtSubquery) {
			extra = append(extra, extraResumedAt)
			sql = strings.ReplaceAll(sql, resumedAtSubquery, fmt.Sprintf("$%d::timestamptz", maxParam(sql)+1))
		}
		for _, e := range []string{extraStart, extraNow} {
			if strings.Contains(sql, e) {
				extra = append(extra, e)
				sql = strings.ReplaceAll(sql, e, fmt.Sprintf("$%d::timestamptz", maxParam(sql)+1))
			}
		}
	}
	return sql, extra
}

// The extra parameters of Citus forms (citusForm): the next epoch, and the
// store's resume time.
const (
	extraEpoch     = nextEpoch
	extraResumedAt = resumedAtSubquery
	extraStart     = "pg_postmaster_start_time()"
	extraNow       = "now()"
)

// serverStartOfLease matches the server's start term of leaseEnd once its
// milliseconds are added by idemgate_plus_ms (citusForm); $1 is the row's
// alias.
var serverStartOfLease = regexp.MustCompile(`idemgate_plus_ms\(pg_postmaster_start_time\(\), ([a-z_]+)\.lease_ms\)`)

// resumedAtSubquery is how leaseEnd reads the store's resume time.
const resumedAtSubquery = "(SELECT resumed_at FROM idemgate_store_state)"

// nextEpochInUpdate starts nextEpochOf, the epoch an UPDATE gives a row.
const nextEpochInUpdate = "greatest(" + nextEpoch + ", "

// maxParam is the highest $n of sql.
func maxParam(sql string) int {
	top := 0
	for i := 0; i < len(sql); i++ {
		if sql[i] != '$' {
			continue
		}
		n, j := 0, i+1
		for j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
			n = n*10 + int(sql[j]-'0')
			j++
		}
		top = max(top, n)
	}
	return top
}

// rewriteCases turns every "CASE WHEN c THEN a ELSE b END" of sql into
// "idemgate_case(c, a, b)", innermost first; a CASE without ELSE gets
// NULL, as CASE does. Keywords count at parenthesis depth 0 of the CASE.
func rewriteCases(sql string) string {
	for {
		start := strings.LastIndex(sql, "CASE WHEN ")
		if start < 0 {
			return sql
		}
		parts := []int{start + len("CASE WHEN ")} // start of c, a, b
		depth, end := 0, -1
		for i := parts[0]; i < len(sql) && end < 0; i++ {
			switch c := sql[i]; {
			case c == '(':
				depth++
			case c == ')':
				depth--
			case depth == 0 && keywordAt(sql, i, "THEN") && len(parts) == 1:
				parts = append(parts, i)
			case depth == 0 && keywordAt(sql, i, "ELSE") && len(parts) == 2:
				parts = append(parts, i)
			case depth == 0 && keywordAt(sql, i, "END"):
				end = i
			}
		}
		if end < 0 || len(parts) < 2 {
			panic(fmt.Sprintf("pgstore: no CASE WHEN c THEN a [ELSE b] END at %d of %s", start, sql))
		}
		cond := strings.TrimSpace(sql[parts[0]:parts[1]])
		thenEnd := end
		elseVal := "NULL"
		if len(parts) == 3 {
			thenEnd = parts[2]
			elseVal = strings.TrimSpace(sql[parts[2]+len("ELSE") : end])
		}
		then := strings.TrimSpace(sql[parts[1]+len("THEN") : thenEnd])
		sql = sql[:start] + "idemgate_case(" + cond + ", " + then + ", " + elseVal + ")" + sql[end+len("END"):]
	}
}

// keywordAt reports whether sql has the word kw at i, between spaces,
// line breaks or parentheses.
func keywordAt(sql string, i int, kw string) bool {
	if !strings.HasPrefix(sql[i:], kw) || i == 0 || isToken(sql[i-1]) {
		return false
	}
	j := i + len(kw)
	return j == len(sql) || !isToken(sql[j])
}

func isToken(c byte) bool {
	return c == '_' || c == '.' || c == '$' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// notifyAfter sends the NOTIFY of a change that found waiters, from the
// coordinator (WithCitus). Its error is dropped: a lost hint only delays
// the waiters until their next poll.
func (s *Store) notifyAfter(ctx context.Context, woken bool, id string) {
	if woken && s.channel != "" {
		_, _ = s.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, s.channel, id)
	}
}

// citusExpiredSQL picks a bounded batch of deletable rows across the
// shards, oldest first (deleteExpiredSQL without its locks).
var citusExpiredSQL = `
SELECT c.namespace, c.scope, c.idempotency_key FROM idemgate_records AS c
WHERE c.expires_at <= now() AND ` + expiry("c") + ` <= now()
ORDER BY c.expires_at
LIMIT $1`

// citusDeleteSQL deletes one row picked by citusExpiredSQL if it is still
// deletable, and says whether it was outcome-unknown.
var citusDeleteSQL = `
DELETE FROM idemgate_records AS r
WHERE namespace = $1 AND scope = $2 AND idempotency_key = $3 AND ` + expiry("r") + ` <= now()
RETURNING state = 'unknown' OR (state = 'in_flight' AND unknown_retention_ms > 0)`

// citusAddReplaySQL adds one record's replays (addReplaysSQL for one count,
// $7 the coordinator's now()).
var citusAddReplaySQL = `
UPDATE idemgate_records AS r
SET replay_count = CASE WHEN ` + replayCountedR + ` THEN r.replay_count ELSE 0 END + $5::bigint,
    last_replayed_at = greatest(CASE WHEN ` + replayCountedR + ` THEN r.last_replayed_at END, $6::timestamptz)
WHERE r.namespace = $1 AND r.scope = $2 AND r.idempotency_key = $3 AND r.state = 'completed' AND r.completed_at = $4`

// citusAddReplays is AddReplays on Citus: one statement per record, in key
// order (so two replicas' flushes queue rather than deadlock), in one
// transaction; a replay's time is the coordinator's clock less its age.
func (s *Store) citusAddReplays(ctx context.Context, counts []dedupesvc.ReplayCount) (int, error) {
	slices.SortFunc(counts, func(a, b dedupesvc.ReplayCount) int {
		return strings.Compare(orderOf(a.ID), orderOf(b.ID))
	})
	updated := 0
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		updated = 0
		var now time.Time
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return err
		}
		for _, c := range counts {
			tag, err := tx.Exec(ctx, citusAddReplaySQL, c.ID.Namespace, c.ID.Scope, c.ID.Key, c.CompletedAt, c.Count, now.Add(-c.Since))
			if err != nil {
				return err
			}
			updated += int(tag.RowsAffected())
		}
		return nil
	})
	return updated, err
}

// citusDeleteExpired is DeleteExpired on Citus (citusExpiredSQL, then
// citusDeleteSQL for each row picked).
func (s *Store) citusDeleteExpired(ctx context.Context, limit int) (int, []dedupesvc.RecordID, error) {
	rows, err := s.pool.Query(ctx, s.q(citusExpiredSQL), limit)
	if err = s.noted(ctx, err); err != nil {
		return 0, nil, fmt.Errorf("pgstore: delete expired: %w", err)
	}
	picked, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (dedupesvc.RecordID, error) {
		var id dedupesvc.RecordID
		err := row.Scan(&id.Namespace, &id.Scope, &id.Key)
		return id, err
	})
	if err = s.noted(ctx, err); err != nil {
		return 0, nil, fmt.Errorf("pgstore: delete expired: %w", err)
	}
	var (
		deleted int
		unknown []dedupesvc.RecordID
	)
	for _, id := range picked {
		var wasLost bool
		err := s.noted(ctx, s.pool.QueryRow(ctx, s.q(citusDeleteSQL), id.Namespace, id.Scope, id.Key).Scan(&wasLost))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // reserved anew meanwhile
		case err != nil:
			return deleted, unknown, fmt.Errorf("pgstore: delete expired: %w", err)
		}
		deleted++
		if wasLost {
			unknown = append(unknown, id)
		}
	}
	return deleted, unknown, nil
}

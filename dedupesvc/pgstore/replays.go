package pgstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
)

var (
	_ dedupesvc.ReplayCounter = (*Store)(nil)
	_ dedupesvc.Forgetter     = (*Store)(nil)
)

// addReplaysSQL adds one flush's counts ($1..$6: arrays of namespace,
// scope, key, completed_at, count and microseconds since the last replay)
// to their records, in one statement. A count whose record no longer holds
// that outcome is dropped by the join. The rows are locked in key order
// first, so two replicas flushing overlapping batches queue instead of
// deadlocking. Counts left from an earlier outcome of the key (migration
// 007) start over. Nothing is announced: no waiter waits for a count.
var addReplaysSQL = `
UPDATE idemgate_records AS r
SET replay_count = CASE WHEN ` + replayCountedR + ` THEN r.replay_count ELSE 0 END + c.n,
    last_replayed_at = greatest(CASE WHEN ` + replayCountedR + ` THEN r.last_replayed_at END, now() - c.since_us * interval '1 microsecond')
FROM (
    SELECT t.namespace, t.scope, t.idempotency_key, c.n, c.since_us
    FROM idemgate_records AS t
    JOIN unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::bigint[], $6::bigint[])
        AS c(namespace, scope, idempotency_key, completed_at, n, since_us)
      ON t.namespace = c.namespace AND t.scope = c.scope AND t.idempotency_key = c.idempotency_key
     AND t.state = 'completed' AND t.completed_at = c.completed_at
    ORDER BY t.namespace, t.scope, t.idempotency_key
    FOR UPDATE OF t
) AS c
WHERE r.namespace = c.namespace AND r.scope = c.scope AND r.idempotency_key = c.idempotency_key`

// replayCountedR is replayCounted for the row aliased r.
const replayCountedR = `(r.replay_count > 0 AND r.last_replayed_at >= r.completed_at)`

// AddReplays implements dedupesvc.ReplayCounter.
func (s *Store) AddReplays(ctx context.Context, counts []dedupesvc.ReplayCount) (int, error) {
	if len(counts) == 0 {
		return 0, nil
	}
	counts = slices.Clone(counts)
	var (
		namespaces, scopes, keys = make([]string, len(counts)), make([]string, len(counts)), make([]string, len(counts))
		completed                = make([]time.Time, len(counts))
		n, since                 = make([]int64, len(counts)), make([]int64, len(counts))
	)
	for i, c := range counts {
		namespaces[i], scopes[i], keys[i], completed[i], n[i], since[i] = c.ID.Namespace, c.ID.Scope, c.ID.Key, c.CompletedAt, c.Count, c.Since.Microseconds()
	}
	if s.citus {
		n, err := s.citusAddReplays(ctx, counts)
		if err != nil {
			return 0, fmt.Errorf("pgstore: add replays: %w", s.noted(ctx, err))
		}
		return n, nil
	}
	tag, err := s.pool.Exec(ctx, addReplaysSQL, namespaces, scopes, keys, completed, n, since)
	if err != nil {
		return 0, fmt.Errorf("pgstore: add replays: %w", s.noted(ctx, err))
	}
	return int(tag.RowsAffected()), nil
}

// forgetSQL retires a record for ForgetRecord, if it still is the one read
// ($4 epoch, $5 state) and not already retired: released, its outcome
// dropped, expired now and its epoch bumped, so the key's next reservation
// (the reserving upsert takes an expired row) gets a higher epoch than any
// attempt before it, and a holder is fenced. The usage trigger subtracts the
// outcome's bytes; the row counts as a record until the sweeper deletes it.
var forgetSQL = `
UPDATE idemgate_records AS r
SET state = 'released', epoch = ` + nextEpochOf("r") + `,
    outcome_type_url = NULL, outcome_value = NULL, outcome_key_id = NULL, completed_at = NULL,
    lease_expires_at = least(lease_expires_at, now()), expires_at = now()
WHERE namespace = $3 AND scope = $1 AND idempotency_key = $2 AND epoch = $4 AND state = $5
  AND NOT (state = 'released' AND expires_at <= now())`

// ForgetRecord implements dedupesvc.Forgetter.
func (s *Store) ForgetRecord(ctx context.Context, p dedupesvc.ForgetParams) (dedupesvc.StoredRecord, error) {
	id := p.ID
	return dedupesvc.RunForget(ctx, p, func(ctx context.Context) (dedupesvc.StoredRecord, bool, error) {
		return s.GetRecord(ctx, id)
	}, func(ctx context.Context, r dedupesvc.StoredRecord) (bool, error) {
		sql := s.q(forgetSQL)
		args, err := s.citusExtraArgs(ctx, sql, []any{id.Scope, id.Key, id.Namespace, r.Epoch, r.State})
		if err != nil {
			return false, fmt.Errorf("pgstore: forget record: %w", err)
		}
		tag, err := s.pool.Exec(ctx, sql, args...)
		if err != nil {
			return false, fmt.Errorf("pgstore: forget record: %w", s.noted(ctx, err))
		}
		if tag.RowsAffected() == 1 && r.State == dedupesvc.StateInFlight && s.channel != "" {
			// Duplicates waiting for the forgotten attempt re-read now
			// rather than at their next poll; a lost hint only delays them.
			_, _ = s.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, s.channel, NotifyID(id))
		}
		return tag.RowsAffected() == 1, nil
	})
}

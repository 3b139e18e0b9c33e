package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/idemgate/idemgate/dedupesvc"
)

var (
	_ dedupesvc.ReplayCounter = (*Store)(nil)
	_ dedupesvc.Forgetter     = (*Store)(nil)
)

// addReplaysSQL adds one flush's counts to their records in one statement:
// :batch is a JSON array of [namespace, scope, key, completed_at, count,
// milliseconds since the last replay]. A count whose record no longer holds
// that outcome is dropped by the join; counts left from an earlier outcome
// of the key (migration 006) start over.
var addReplaysSQL = `
UPDATE idemgate_records AS r
SET replay_count = CASE WHEN ` + replayCountedR + ` THEN r.replay_count ELSE 0 END + c.n,
    last_replayed_at = max(coalesce(CASE WHEN ` + replayCountedR + ` THEN r.last_replayed_at END, 0), :now - c.since_ms)
FROM (
    SELECT value ->> 0 AS namespace, value ->> 1 AS scope, value ->> 2 AS idempotency_key,
           value ->> 3 AS completed_at, value ->> 4 AS n, value ->> 5 AS since_ms
    FROM json_each(:batch)
) AS c
WHERE r.namespace = c.namespace AND r.scope = c.scope AND r.idempotency_key = c.idempotency_key
  AND r.state = 'completed' AND r.completed_at = c.completed_at`

// replayCountedR is replayCounted for the row aliased r.
const replayCountedR = `(r.replay_count > 0 AND r.last_replayed_at >= r.completed_at)`

// AddReplays implements dedupesvc.ReplayCounter.
func (s *Store) AddReplays(ctx context.Context, counts []dedupesvc.ReplayCount) (int, error) {
	if len(counts) == 0 {
		return 0, nil
	}
	batch := make([][]any, len(counts))
	for i, c := range counts {
		batch[i] = []any{c.ID.Namespace, c.ID.Scope, c.ID.Key, c.CompletedAt.UnixMilli(), c.Count, c.Since.Milliseconds()}
	}
	raw, err := json.Marshal(batch)
	if err != nil {
		return 0, fmt.Errorf("sqlitestore: add replays: %w", err)
	}
	res, err := s.db.ExecContext(ctx, addReplaysSQL, sql.Named("batch", string(raw)), sql.Named("now", s.now().UnixMilli()))
	if err != nil {
		return 0, fmt.Errorf("sqlitestore: add replays: %w", err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// forgetSQL retires a record for ForgetRecord (see pgstore's forgetSQL): if
// it still is the one read and not already retired, it becomes released and
// expired, its outcome dropped and given a new epoch (nextEpoch).
var forgetSQL = `
UPDATE idemgate_records
SET state = 'released', epoch = ` + nextEpoch + `,
    outcome_type_url = NULL, outcome_value = NULL, outcome_key_id = NULL, completed_at = NULL,
    lease_expires_at = min(lease_expires_at, :now), expires_at = :now
WHERE namespace = :ns AND scope = :scope AND idempotency_key = :key AND epoch = :epoch AND state = :state
  AND NOT (state = 'released' AND expires_at <= :now)`

// ForgetRecord implements dedupesvc.Forgetter.
func (s *Store) ForgetRecord(ctx context.Context, p dedupesvc.ForgetParams) (dedupesvc.StoredRecord, error) {
	id := p.ID
	return dedupesvc.RunForget(ctx, p, func(ctx context.Context) (dedupesvc.StoredRecord, bool, error) {
		return s.GetRecord(ctx, id)
	}, func(ctx context.Context, r dedupesvc.StoredRecord) (bool, error) {
		// change wakes this process's duplicates waiting on the record.
		n, err := exec{q: s.prepared(nil), wake: s.waiters.Wake}.change(ctx, id, forgetSQL, sql.Named("now", s.now().UnixMilli()),
			sql.Named("ns", id.Namespace), sql.Named("scope", id.Scope), sql.Named("key", id.Key), sql.Named("epoch", r.Epoch), sql.Named("state", r.State))
		if err != nil {
			return false, fmt.Errorf("sqlitestore: forget record: %w", err)
		}
		return n == 1, nil
	})
}

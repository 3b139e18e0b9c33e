package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// On Citus the resume of the store is noted and marked per worker (a node
// group of pg_dist_placement), not for the store as a whole: a worker's
// outage refuses the renewals of the holders on its shards only, so the
// grace it calls for is theirs, and the statements that must wait for it
// are the ones on its shards. The mark is a row per shard of
// idemgate_resume_marks (migration 015), co-located with the records and
// written by a statement on that shard alone, which leaseEnd's Citus form
// reads on the worker (idemgate_shard_resumed_plus_ms). The store-wide mark
// in the reference table idemgate_store_state is a write on every node, so
// one worker down made every statement of a replica that noticed wait for
// a mark that could not commit (issue 38 item 4).

// nodeStates is the resume state of the Citus node groups, under the
// Store's resumeMu. Generations are the Store's cutGen.
type nodeStates struct {
	// all is the generation of the last failure that cut off every worker
	// (one not known to be a single worker's).
	all    uint64
	groups map[int32]*nodeResume
	// listed is every group holding shards of the marks, as last read.
	listed []int32
	// keys caches the group of a key's shard while some worker is cut off.
	keys map[string]int32
	// reps caches, per shard of the marks, a key that hashes into it.
	reps map[int64]string
}

// nodeResume is one node group's resume state.
type nodeResume struct {
	// cut is the generation of the last failure noted on this group alone;
	// marked the generation when the last mark of its shards that
	// succeeded started. Its statements wait while marked < max(cut, all).
	cut, marked uint64
	// marking is the mark in progress (nil when none); timeouts counts its
	// marks in a row that ran out of their own time (markTimeout).
	marking  *markCall
	timeouts int
	// awayErr is the error of its last mark that found the node
	// unreachable; until awayUntil its statements fail with it at once,
	// as resume paces a plain PostgreSQL's (awayBackoff, awayDelay).
	awayErr   error
	awayUntil time.Time
	awayDelay time.Duration
}

// group returns g's state, made on first use.
func (n *nodeStates) group(g int32) *nodeResume {
	if n.groups == nil {
		n.groups = map[int32]*nodeResume{}
	}
	r := n.groups[g]
	if r == nil {
		r = &nodeResume{}
		n.groups[g] = r
	}
	return r
}

// cut records a failure of generation gen: of group g alone when one,
// else of every group.
func (n *nodeStates) cut(g int32, one bool, gen uint64) {
	if one {
		n.group(g).cut = gen
	} else {
		n.all = gen
	}
}

// resumed reports whether g's shards were marked since the last failure
// that concerns them.
func (n *nodeStates) resumed(g int32) bool {
	r := n.group(g)
	return r.marked >= max(r.cut, n.all)
}

// allResumed reports whether every listed group is resumed.
func (n *nodeStates) allResumed() bool {
	if len(n.listed) == 0 {
		return false
	}
	for _, g := range n.listed {
		if !n.resumed(g) {
			return false
		}
	}
	return true
}

// remoteNodeFailed reports whether err is the coordinator answering that it
// could not reach another node (Citus raises connection_failure, class 08,
// "connection to the remote node ... failed"): the coordinator is up, the
// worker the statement went to is not reachable from it.
func remoteNodeFailed(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "08")
}

// groupOfKeySQL is the node group holding the shard of a key; the marks'
// shard of the same index is there too (co-located).
const groupOfKeySQL = `
SELECT min(p.groupid) FROM pg_dist_placement AS p
WHERE p.shardid = get_shard_id_for_distribution_column('idemgate_records', $1::text)`

// groupOfKey returns the node group of key's shard, from the coordinator's
// metadata (no worker is asked), cached while a worker is cut off. The
// lookup gets its own time (markTimeout), so a caller whose context ended
// still has its failure placed.
func (s *Store) groupOfKey(ctx context.Context, key string) (int32, error) {
	s.resumeMu.Lock()
	g, ok := s.nodes.keys[key]
	s.resumeMu.Unlock()
	if ok {
		return g, nil
	}
	lookupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout(0))
	defer cancel()
	var found *int32
	if err := s.pool.QueryRow(lookupCtx, groupOfKeySQL, key).Scan(&found); err != nil {
		return 0, err
	}
	if found == nil {
		return 0, fmt.Errorf("pgstore: no placement for the shard of a key")
	}
	s.resumeMu.Lock()
	if s.nodes.keys == nil || len(s.nodes.keys) >= 1<<14 {
		s.nodes.keys = map[string]int32{}
	}
	s.nodes.keys[key] = *found
	s.resumeMu.Unlock()
	return *found, nil
}

// markShardsSQL lists the shards of the marks and their node groups.
const markShardsSQL = `
SELECT s.shardid, min(p.groupid) FROM pg_dist_shard AS s JOIN pg_dist_placement AS p USING (shardid)
WHERE s.logicalrelid = 'idemgate_resume_marks'::regclass
GROUP BY s.shardid ORDER BY s.shardid`

// shardRepsSQL finds a key of each shard of the marks among the first
// 65,536 of a fixed series, by the coordinator's metadata alone: the
// shard's mark row is written under it, so the write goes to that shard
// alone. Among 32 equal shards each is found within the first few hundred.
const shardRepsSQL = `
SELECT DISTINCT ON (shard) shard, key FROM (
    SELECT get_shard_id_for_distribution_column('idemgate_resume_marks', 'idemgate-resume-' || i) AS shard,
           'idemgate-resume-' || i AS key, i
    FROM generate_series(0, 65535) AS i) AS c
ORDER BY shard, i`

// markShardSQL marks one shard resumed at the coordinator's now(), never
// moving a mark back.
const markShardSQL = `
INSERT INTO idemgate_resume_marks AS m (idempotency_key, resumed_at) VALUES ($1, now())
ON CONFLICT (idempotency_key) DO UPDATE SET resumed_at = greatest(m.resumed_at, excluded.resumed_at)`

// shardsOf lists the shards of the marks with a key of each, refreshing
// the listed groups, and returns those of group g (every group's when
// all).
func (s *Store) shardsOf(ctx context.Context, g int32, all bool) (map[int32][]string, error) {
	rows, err := s.pool.Query(ctx, markShardsSQL)
	if err != nil {
		return nil, err
	}
	type shard struct {
		id    int64
		group int32
	}
	shards, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (shard, error) {
		var sh shard
		err := row.Scan(&sh.id, &sh.group)
		return sh, err
	})
	if err != nil {
		return nil, err
	}
	s.resumeMu.Lock()
	s.nodes.listed = s.nodes.listed[:0]
	missing := false
	for _, sh := range shards {
		if !slices.Contains(s.nodes.listed, sh.group) {
			s.nodes.listed = append(s.nodes.listed, sh.group)
		}
		if _, ok := s.nodes.reps[sh.id]; !ok && (all || sh.group == g) {
			missing = true
		}
	}
	s.resumeMu.Unlock()
	if missing {
		rows, err := s.pool.Query(ctx, shardRepsSQL)
		if err != nil {
			return nil, err
		}
		type rep struct {
			shard int64
			key   string
		}
		reps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (rep, error) {
			var r rep
			err := row.Scan(&r.shard, &r.key)
			return r, err
		})
		if err != nil {
			return nil, err
		}
		s.resumeMu.Lock()
		if s.nodes.reps == nil {
			s.nodes.reps = map[int64]string{}
		}
		for _, r := range reps {
			s.nodes.reps[r.shard] = r.key
		}
		s.resumeMu.Unlock()
	}
	out := map[int32][]string{}
	s.resumeMu.Lock()
	defer s.resumeMu.Unlock()
	for _, sh := range shards {
		if !all && sh.group != g {
			continue
		}
		key, ok := s.nodes.reps[sh.id]
		if !ok {
			return nil, fmt.Errorf("pgstore: no key of shard %d of idemgate_resume_marks among the first 65536", sh.id)
		}
		out[sh.group] = append(out[sh.group], key)
	}
	return out, nil
}

// markGroup marks the shards of group g resumed, each in a statement on
// that shard alone, so it needs g's worker and the coordinator only. A
// failure is noted: on g alone when the coordinator answered that it could
// not reach a worker.
func (s *Store) markGroup(ctx context.Context, g int32, keys []string) error {
	for _, key := range keys {
		if _, err := s.pool.Exec(ctx, markShardSQL, key); err != nil {
			return fmt.Errorf("pgstore: mark resumed: %w", s.notedGroup(ctx, g, remoteNodeFailed(err), err))
		}
	}
	return nil
}

// notedGroup is noted with the failure placed: on group g alone when one.
func (s *Store) notedGroup(ctx context.Context, g int32, one bool, err error) error {
	if readOnlyServer(err) {
		s.pool.Reset()
		one = false
	} else if !unreachable(ctx, err) {
		return err
	}
	s.resumeMu.Lock()
	s.cutGen++
	s.nodes.cut(g, one, s.cutGen)
	s.cutOff.Store(true)
	s.resumeMu.Unlock()
	return err
}

// markNodes is MarkResumed on Citus: the shards of every worker marked,
// worker by worker, so each worker reachable is marked even when another
// is not; then, when every one was, the store-wide mark too, for replicas
// of a version that reads only that one.
func (s *Store) markNodes(ctx context.Context) error {
	if s.markHook != nil {
		s.markHook(ctx)
	}
	byGroup, err := s.shardsOf(ctx, 0, true)
	if err != nil {
		return fmt.Errorf("pgstore: mark resumed: %w", s.noted(ctx, err))
	}
	var errs []error
	for g, keys := range byGroup {
		errs = append(errs, s.markGroup(ctx, g, keys))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	s.markStore(ctx)
	return nil
}

// markStore writes the store-wide mark, best effort: a replica of an older
// version reads only that one. Its failure (a write on every node, it
// fails while any is down) is not noted: the shards' marks already stand.
func (s *Store) markStore(ctx context.Context) {
	_, _ = s.pool.Exec(ctx, s.q(markResumedSQL))
}

// resumeNodes is resume on Citus, for an operation on the records of key
// (on every worker when key is ""): it waits only for the marks of the
// workers the operation touches, each marked by the first operation that
// needs it, the others waiting for that mark as resume's do. The flag
// cutOff is cleared once every worker was marked since the failures noted
// on it.
func (s *Store) resumeNodes(ctx context.Context, key string) error {
	for s.cutOff.Load() {
		var groups []int32
		if key != "" {
			g, err := s.groupOfKey(ctx, key)
			if err != nil {
				return fmt.Errorf("pgstore: the worker of a key: %w", s.noted(ctx, err))
			}
			groups = []int32{g}
		}
		s.resumeMu.Lock()
		if key == "" {
			groups = slices.Clone(s.nodes.listed)
		}
		var (
			n     *nodeResume
			group int32
		)
		for _, g := range groups {
			if !s.nodes.resumed(g) {
				n, group = s.nodes.group(g), g
				break
			}
		}
		if n == nil && len(groups) > 0 {
			s.resumeMu.Unlock()
			return nil
		}
		if n != nil && n.marking != nil {
			c := n.marking
			s.resumeMu.Unlock()
			if err := s.waitMark(ctx, c); err != nil {
				return err
			}
			continue
		}
		if n != nil && n.awayErr != nil && time.Now().Before(n.awayUntil) {
			err := n.awayErr
			s.resumeMu.Unlock()
			s.pacedCalls.Add(1)
			return err
		}
		c := &markCall{done: make(chan struct{})}
		if n != nil {
			n.marking = c
		}
		gen := s.cutGen
		timeouts := 0
		if n != nil {
			timeouts = n.timeouts
		}
		markCtx, cancel := context.WithTimeout(ctx, markTimeout(timeouts))
		s.resumeMu.Unlock()
		err := s.markOne(markCtx, n != nil, group)
		timedOut := err != nil && markCtx.Err() != nil && ctx.Err() == nil
		cancel()
		s.resumeMu.Lock()
		cleared := false
		if n != nil {
			n.marking = nil
			switch {
			case err == nil:
				n.timeouts = 0
				n.marked = max(n.marked, gen)
				n.awayErr, n.awayDelay = nil, 0
			case timedOut:
				n.timeouts++
			case ctx.Err() == nil && cuts(ctx, err):
				s.failedMarks.Add(1)
				n.awayDelay = awayBackoff(n.awayDelay)
				n.awayErr, n.awayUntil = err, time.Now().Add(jittered(n.awayDelay))
			}
		}
		if err == nil && s.nodes.allResumed() {
			s.cutOff.Store(false)
			s.nodes.keys = nil
			cleared = true
		}
		c.err, c.gaveUp = err, err != nil && (timedOut || ctx.Err() != nil)
		close(c.done)
		s.resumeMu.Unlock()
		if cleared {
			s.markStore(ctx)
		}
		if err != nil && !timedOut {
			return err
		}
	}
	return nil
}

// markOne marks group g's shards (one), or, before the groups were ever
// listed, only lists them (shardsOf), so the loop of resumeNodes finds the
// groups to mark.
func (s *Store) markOne(ctx context.Context, one bool, g int32) error {
	if s.markHook != nil {
		s.markHook(ctx)
	}
	byGroup, err := s.shardsOf(ctx, g, false)
	if err != nil {
		return fmt.Errorf("pgstore: mark resumed: %w", s.noted(ctx, err))
	}
	if !one {
		return nil
	}
	return s.markGroup(ctx, g, byGroup[g])
}

// waitMark waits for the mark c, and returns its error unless the marking
// caller gave up (its context, or the mark's own time, ended): then the
// waiter marks itself.
func (s *Store) waitMark(ctx context.Context, c *markCall) error {
	s.markWaiting.Add(1)
	defer s.markWaiting.Add(-1)
	select {
	case <-c.done:
	case <-ctx.Done():
		return fmt.Errorf("pgstore: waiting for the store to be marked resumed: %w", ctx.Err())
	}
	if c.err != nil && !c.gaveUp {
		return c.err
	}
	return nil
}

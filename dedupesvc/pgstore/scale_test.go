package pgstore_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// BenchmarkScale measures Begin on a table already holding many records,
// and the sweeper's cost there. It runs only with IDEMGATE_SCALE_ROWS set to
// the table sizes to measure, comma-separated (0 is the empty table):
//
//	IDEMGATE_SCALE_ROWS=0,1000000,10000000 go test -run '^$' -bench BenchmarkScale -benchtime 400x -timeout 2h ./dedupesvc/pgstore/
//
// Each size gets a throwaway schema, filled by generate_series: completed
// records, one in ten expired so the sweeper has work. The sizes are
// measured in alternating rounds (compare with benchstat -ignore /round).
// Operations, one caller each: fresh (Begin of a new key), replay (Begin of a random stored
// key: a duplicate), replay-hot (Begin of one stored key, again and again),
// fresh-while-sweeping (fresh with a sweeper deleting
// expired records without pause beside it: its worst case, where the
// service's sweeper pauses a minute between passes), and sweep-pass (one
// pass of the sweeper over what is left expired, timed once: read its
// s/pass and rows/s).
func BenchmarkScale(b *testing.B) {
	sizes := os.Getenv("IDEMGATE_SCALE_ROWS")
	if sizes == "" {
		b.Skip("set IDEMGATE_SCALE_ROWS (e.g. 0,1000000) to run")
	}
	ctx := context.Background()
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var seq atomic.Int64
	params := func(key, token string) dedupesvc.BeginParams {
		return dedupesvc.BeginParams{Namespace: "bench", Scope: "/bench.S/M", Key: key, Fingerprint: scaleFingerprint, AttemptToken: token,
			Lease: time.Minute, Retention: time.Hour, UnknownRetention: time.Hour,
			MaxRecords: 1 << 40, MaxOutcomeBytes: 1 << 50}
	}
	type table struct {
		rows int64
		s    *pgstore.Store
	}
	var tables []table
	for _, field := range strings.Split(sizes, ",") {
		rows, err := strconv.ParseInt(strings.TrimSpace(field), 10, 64)
		if err != nil {
			b.Fatalf("IDEMGATE_SCALE_ROWS: %v", err)
		}
		pool, _ := pgtest.Schema(b)
		populate(b, pool, rows)
		s := pgstore.New(pool)
		done := params("done-"+run, "holder")
		r, err := s.Begin(ctx, done)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Finish(ctx, dedupesvc.FinishParams{Namespace: "bench", Scope: done.Scope, Key: done.Key, AttemptToken: "holder", Epoch: r.Epoch,
			Outcome: dedupesvc.Outcome{TypeURL: "type.googleapis.com/bench.R", Value: []byte("stored")}}); err != nil {
			b.Fatal(err)
		}
		tables = append(tables, table{rows, s})
	}
	fresh := func(b *testing.B, s *pgstore.Store) {
		key := fmt.Sprintf("fresh-%s-%d", run, seq.Add(1))
		if res, err := s.Begin(ctx, params(key, key)); err != nil || res.State != dedupesvc.BeginReserved {
			b.Fatalf("Begin = %+v, %v", res, err)
		}
	}
	replay := func(b *testing.B, s *pgstore.Store, key string) {
		if res, err := s.Begin(ctx, params(key, "dup")); err != nil || res.State != dedupesvc.BeginCompleted {
			b.Fatalf("Begin(%s) = %+v, %v", key, res, err)
		}
	}
	// Rounds alternate the sizes, so a change in the machine's load lands
	// on every size alike; benchstat -ignore /round merges them.
	for round := range scaleRounds {
		for _, t := range tables {
			name := fmt.Sprintf("rows=%d/round=%d", t.rows, round)
			b.Run(name+"/op=fresh", func(b *testing.B) {
				for b.Loop() {
					fresh(b, t.s)
				}
			})
			b.Run(name+"/op=replay", func(b *testing.B) {
				for b.Loop() {
					key := "done-" + run
					if t.rows > 0 {
						// A live record: one in ten (i % 10 == 0) is expired.
						i := rand.Int64N(t.rows) + 1
						if i%10 == 0 {
							i--
						}
						key = "pre-" + strconv.FormatInt(max(i, 1), 10)
					}
					replay(b, t.s, key)
				}
			})
			b.Run(name+"/op=replay-hot", func(b *testing.B) {
				// One stored key again and again: its pages stay cached, which
				// separates the table's size from the working set's.
				for b.Loop() {
					replay(b, t.s, "done-"+run)
				}
			})
		}
	}
	for _, t := range tables {
		s := t.s
		b.Run(fmt.Sprintf("rows=%d/op=fresh-while-sweeping", t.rows), func(b *testing.B) {
			sweepCtx, stop := context.WithCancel(ctx)
			var deleted atomic.Int64
			done := make(chan struct{})
			go func() {
				defer close(done)
				for sweepCtx.Err() == nil {
					n, _, err := s.DeleteExpired(sweepCtx, 1000)
					deleted.Add(int64(n))
					if err != nil || n == 0 {
						return // nothing left to sweep (or stopped)
					}
				}
			}()
			for b.Loop() {
				fresh(b, s)
			}
			stop()
			<-done
			b.ReportMetric(float64(deleted.Load()), "swept")
		})
		b.Run(fmt.Sprintf("rows=%d/op=sweep-pass", t.rows), func(b *testing.B) {
			// One pass of the service's sweeper (batches of 1000, at most 100
			// a pass, the SweeperConfig defaults), timed once: b.N does not
			// apply, read s/pass and rows/s, not ns/op.
			sweeper := dedupesvc.NewSweeper(s, dedupesvc.SweeperConfig{BatchSize: 1000, MaxBatches: 100, Logger: quietLogger})
			start := time.Now()
			n, err := sweeper.SweepOnce(ctx)
			if err != nil {
				b.Fatal(err)
			}
			took := time.Since(start)
			for b.Loop() {
			}
			b.ReportMetric(took.Seconds(), "s/pass")
			b.ReportMetric(float64(n), "rows/pass")
			b.ReportMetric(float64(n)/took.Seconds(), "rows/s")
		})
	}
}

// scaleRounds is how many times BenchmarkScale measures each size.
const scaleRounds = 5

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

var scaleFingerprint = func() []byte { fp := sha256.Sum256([]byte("scale")); return fp[:] }()

// populate fills the schema's table with rows completed records, one in ten
// expired, in chunks of a million, with the usage triggers off (then the
// usage counted once, as migration 005 does) and the table analysed.
func populate(b *testing.B, pool *pgxpool.Pool, rows int64) {
	ctx := context.Background()
	if rows == 0 {
		return
	}
	started := time.Now()
	if _, err := pool.Exec(ctx, `ALTER TABLE idemgate_records DISABLE TRIGGER USER`); err != nil {
		b.Fatal(err)
	}
	const chunk = 1_000_000
	for from := int64(1); from <= rows; from += chunk {
		to := min(from+chunk-1, rows)
		if _, err := pool.Exec(ctx, `
INSERT INTO idemgate_records (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    outcome_type_url, outcome_value, retention_ms, lease_ms, lease_expires_at, expires_at, created_at, completed_at)
SELECT 'bench', '/bench.S/M', 'pre-' || i, $1, 'completed', 'tok-' || i, 1,
    'type.googleapis.com/bench.R', '\x0a0663686172676510 01'::bytea, 86400000, 60000, now(),
    CASE WHEN i % 10 = 0 THEN now() - interval '1 hour' ELSE now() + interval '1 day' END, now(), now()
FROM generate_series($2::bigint, $3::bigint) AS i`, scaleFingerprint, from, to); err != nil {
			b.Fatalf("populate: %v", err)
		}
	}
	for _, q := range []string{
		`ALTER TABLE idemgate_records ENABLE TRIGGER USER`,
		`DELETE FROM idemgate_namespace_usage`,
		`INSERT INTO idemgate_namespace_usage (namespace, shard, records, outcome_bytes)
		 SELECT namespace, 0, count(*), coalesce(sum(octet_length(outcome_value)), 0) FROM idemgate_records GROUP BY namespace`,
		`VACUUM ANALYZE idemgate_records`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatalf("populate: %s: %v", q, err)
		}
	}
	var size string
	if err := pool.QueryRow(ctx, `SELECT pg_size_pretty(pg_total_relation_size('idemgate_records'))`).Scan(&size); err != nil {
		b.Fatal(err)
	}
	b.Logf("populated %d records (%s with indexes) in %v", rows, size, time.Since(started).Round(time.Second))
}

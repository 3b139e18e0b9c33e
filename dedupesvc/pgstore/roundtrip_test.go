package pgstore_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// statementCounter is a pgx tracer that counts the statements sent.
type statementCounter struct {
	mu  sync.Mutex
	sql []string
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sql = append(c.sql, data.SQL)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.sql
	c.sql = nil
	return out
}

// TestBeginIsOneStatement pins the cost of the two common Begins: a fresh
// key is reserved by one statement (one round trip, one commit), and a
// duplicate of a completed key is answered by one statement that changes
// nothing (the row keeps its xmin: no update, no new row version), with and
// without a quota to check.
func TestBeginIsOneStatement(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Schema(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	counter := &statementCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := pgstore.New(pool)
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	for _, quota := range []int64{0, 1000} {
		p := begin("t1")
		p.Key = "fresh-" + string(rune('a'+quota%26))
		p.MaxRecords, p.MaxOutcomeBytes = quota, quota*1000
		counter.take()
		res, err := s.Begin(ctx, p)
		if err != nil || res.State != dedupesvc.BeginReserved {
			t.Fatalf("Begin = %+v, %v", res, err)
		}
		if got := counter.take(); len(got) != 1 {
			t.Fatalf("quota %d: a fresh key cost %d statements, want 1:\n%v", quota, len(got), got)
		}
		if err := s.Finish(ctx, dedupesvc.FinishParams{Scope: p.Scope, Key: p.Key, AttemptToken: "t1", Epoch: res.Epoch,
			Outcome: dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.A", Value: []byte("A")}}); err != nil {
			t.Fatal(err)
		}
		var before, after string
		xmin := `SELECT xmin::text FROM idemgate_records WHERE idempotency_key = $1`
		if err := pool.QueryRow(ctx, xmin, p.Key).Scan(&before); err != nil {
			t.Fatal(err)
		}
		counter.take()
		p.AttemptToken = "t2"
		if res, err := s.Begin(ctx, p); err != nil || res.State != dedupesvc.BeginCompleted || string(res.Outcome.Value) != "A" {
			t.Fatalf("replay Begin = %+v, %v", res, err)
		}
		if got := counter.take(); len(got) != 1 {
			t.Fatalf("quota %d: a replay cost %d statements, want 1:\n%v", quota, len(got), got)
		}
		if err := pool.QueryRow(ctx, xmin, p.Key).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if before != after {
			t.Fatalf("a replay rewrote the row (xmin %s, then %s)", before, after)
		}
	}
}

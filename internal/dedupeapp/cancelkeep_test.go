package dedupeapp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// A statement whose caller gives up while the database is still answering
// it (a Begin whose caller's deadline ran out under load) keeps the pool's
// connection when the answer comes within pgstore.CancelGrace: pgx's
// default closes the connection at once, and after a store's return, when
// every waiting caller's deadline runs out at once, each such close cost a
// new connection (on Citus a coordinator backend and its connections to the
// workers), which slowed the store further (issue 38 item 3).
func TestACallerGivingUpKeepsThePoolsConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := dedupeapp.OpenPool(ctx, dedupeapp.Config{DatabaseURL: pgtest.SchemaURL(t), MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	before := pool.Stat().NewConnsCount()
	for range 5 {
		callCtx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		var slept string
		err := pool.QueryRow(callCtx, "SELECT pg_sleep(0.2)::text").Scan(&slept)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Logf("the call that gave up: %v", err)
		}
	}
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if n := pool.Stat().NewConnsCount() - before; n != 0 {
		t.Errorf("5 callers gave up 20ms into a 200ms statement: the pool made %d new connections, want 0", n)
	}
}

package console_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/internal/console"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// The overview shows the store's health as the page is made: PostgreSQL
// answering as the primary, then, its pool closed, not answering, with the
// error and what to check; the page still renders.
func TestOverviewShowsTheStoresHealth(t *testing.T) {
	t.Parallel()
	var broken atomic.Bool
	closed := closedPool(t)
	f := newFixture(t, func(c *console.Config) {
		check := c.Health
		c.Health = func(ctx context.Context) console.StoreHealth {
			if broken.Load() {
				return console.PostgresHealth(ctx, closed, false)
			}
			return check(ctx)
		}
	})
	b := f.browser(t)
	b.signedIn()
	if _, page := b.get("/"); !strings.Contains(page, `id="store-health" class="ok">PostgreSQL `) || !strings.Contains(page, "answering (the primary (read-write)") {
		t.Fatalf("the overview does not show PostgreSQL answering:\n%s", page)
	}
	broken.Store(true)
	if _, page := b.get("/"); !strings.Contains(page, `id="store-health" class="error">PostgreSQL: NOT answering (the check failed: `) ||
		!strings.Contains(page, "check the server and the network to it") {
		t.Fatalf("the overview does not show PostgreSQL failing:\n%s", page)
	}
}

// closedPool is a pool of the test's server, closed.
func closedPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, _ := pgtest.EmptySchema(t)
	pool.Close()
	return pool
}

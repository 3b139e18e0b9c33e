//go:build citus

package pgstore_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/citustest"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// workerGraceLease is the lease of the abandoned holders of
// TestCitusWorkerRestartGrantsTheGrace: the coordinator has run longer
// than it when the worker is killed, so only the worker's restart can
// grant them a grace, which then lasts this long, room for a starved
// scheduler to run two Begins.
const workerGraceLease = 30 * time.Second

// TestCitusWorkerRestartGrantsTheGrace: on one PostgreSQL a restart of the
// database grants every in-flight lease one more full lease
// (pg_postmaster_start_time() in leaseEnd), even through a replica that saw
// no failure, so a holder cut off by the restart keeps its key. On Citus,
// the same for a worker killed -9 and restarted while the coordinator stays
// up: holders on its shards, whose lease ran out while they could not renew,
// are found in flight by a REEXECUTE Begin (no takeover) and by a
// FAIL_CLOSED one (not outcome-unknown), and an operator's Resolve of one
// is refused as it would be while its holder may still finish, through a
// replica that saw nothing. (Begin reads the record first, on the worker;
// Resolve goes straight to its UPDATE, whose lease end Citus evaluated on
// the coordinator before the fix, with the coordinator's start.)
// The holders' lease is shorter than the coordinator's uptime and longer
// than the restarted worker's, and the last resume mark an hour old, so
// only the worker's start can grant it.
func TestCitusWorkerRestartGrantsTheGrace(t *testing.T) {
	c := citustest.New(t, 2)
	pool, schema := c.Schema(t)
	reexecuteKey := "grace-reexecute"
	worker, _ := c.WorkerOf(t, schema, reexecuteKey)
	var others []string // the FAIL_CLOSED Begin's key and the Resolve's
	for i := 0; len(others) < 2; i++ {
		if k := fmt.Sprintf("grace-%d", i); sameNode(c.WorkerOf(t, schema, k)) == worker {
			others = append(others, k)
		}
	}
	failClosedKey, resolveKey := others[0], others[1]
	if up := uptime(t, c.Coordinator); up <= workerGraceLease {
		time.Sleep(workerGraceLease - up + time.Second)
	}
	p := begin("holder")
	for _, key := range []string{reexecuteKey, failClosedKey, resolveKey} {
		if _, err := pool.Exec(ctx, `
INSERT INTO idemgate_records (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    retention_ms, lease_ms, unknown_retention_ms, lease_expires_at, expires_at)
VALUES ('', $1, $2, $3, 'in_flight', 'holder', 1, 3600000, $4, 3600000, now() - interval '1 hour', now() + interval '1 hour')`,
			p.Scope, key, p.Fingerprint, workerGraceLease.Milliseconds()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE idemgate_store_state SET resumed_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}

	worker.Kill(t)
	worker.Start(t)

	// A replica that saw no failure: its pool connects after the restart.
	taker := pgstore.New(c.OpenPool(t, schema), pgstore.WithoutNotify(), pgstore.WithCitus())
	q := reexecute(begin("taker"))
	q.Key = reexecuteKey
	reexecuted, reexecuteErr := taker.Begin(ctx, q)
	q = begin("taker")
	q.Key = failClosedKey
	failedClosed, failClosedErr := taker.Begin(ctx, q)
	resolveErr := taker.Resolve(ctx, dedupesvc.ResolveParams{Scope: q.Scope, Key: resolveKey})
	if up := uptime(t, worker); up >= workerGraceLease {
		t.Skipf("the Begins ended %v after the worker's restart, past the grace it grants", up)
	}
	if reexecuteErr != nil || reexecuted.State != dedupesvc.BeginInFlight {
		t.Errorf("REEXECUTE Begin after the worker's restart = %+v, %v; want in flight (the restart's grace)", reexecuted, reexecuteErr)
	}
	if failClosedErr != nil || failedClosed.State != dedupesvc.BeginInFlight {
		t.Errorf("FAIL_CLOSED Begin after the worker's restart = %+v, %v; want in flight (the restart's grace)", failedClosed, failClosedErr)
	}
	if !errors.Is(resolveErr, dedupesvc.ErrNotUnknown) {
		t.Errorf("Resolve after the worker's restart = %v; want %v (the restart's grace)", resolveErr, dedupesvc.ErrNotUnknown)
	}
}

func sameNode(n *pgtest.Cluster, _ int64) *pgtest.Cluster { return n }

// uptime is how long node's server has run, by its own clock.
func uptime(t *testing.T, node *pgtest.Cluster) time.Duration {
	t.Helper()
	conn, err := pgx.Connect(ctx, node.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var ms float64
	if err := conn.QueryRow(ctx, `SELECT extract(epoch FROM now() - pg_postmaster_start_time()) * 1000`).Scan(&ms); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ms) * time.Millisecond
}

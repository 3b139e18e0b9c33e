//go:build citus

package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/citustest"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// outageLease is the lease of the holders of TestCitusWorkerOutage: every
// node has run longer than it when the worker is cut off, so only a resume
// mark can grant them a grace, which then lasts this long, room for a
// starved scheduler to run a Begin and a Resolve.
const outageLease = 30 * time.Second

// TestCitusWorkerOutage: a worker cut off from the coordinator without
// restarting (its pg_hba.conf refuses every TCP connection and its client
// backends are ended), seen by a replica whose Begin on one of its keys
// failed. While it is away, that replica's Begins on keys of the other
// worker all reserve, interleaved with Begins on the cut-off worker's keys,
// which fail. Before the fix none did: the replica's resume mark wrote the
// reference table idemgate_store_state on every node, and every statement
// waited for it (issue 38 item 4).
//
// Once the worker is back, the grace still holds for the holders on its
// shards, whose renewals its outage refused and whose lease ran out
// meanwhile (abandoned rows, lease_expires_at an hour ago): the replica
// that saw the outage marks its resume before it decides, so its REEXECUTE
// Begin finds the key in flight; and then, with the store-wide mark of
// idemgate_store_state set back an hour, a replica that saw nothing finds a
// FAIL_CLOSED key in flight (not outcome-unknown) and has a Resolve
// refused: the grace is the cut-off worker's own mark, in the statement on
// that worker. The worker never restarted, so its start grants nothing.
func TestCitusWorkerOutage(t *testing.T) {
	c := citustest.New(t, 2)
	pool, schema := c.Schema(t)
	away, live := c.Workers[1], c.Workers[0]
	keysOn := func(node *pgtest.Cluster, prefix string, n int) []string {
		var keys []string
		for i := 0; len(keys) < n; i++ {
			if k := fmt.Sprintf("%s-%d", prefix, i); sameNode(c.WorkerOf(t, schema, k)) == node {
				keys = append(keys, k)
			}
		}
		return keys
	}
	liveKeys := keysOn(live, "live", 40)
	awayKeys := keysOn(away, "away", 40)
	held := keysOn(away, "held", 3)
	reexecuteKey, failClosedKey, resolveKey := held[0], held[1], held[2]

	for _, node := range append([]*pgtest.Cluster{c.Coordinator}, c.Workers...) {
		if up := uptime(t, node); up <= outageLease {
			time.Sleep(outageLease - up + time.Second)
		}
	}
	p := begin("holder")
	for _, key := range held {
		if _, err := pool.Exec(ctx, `
INSERT INTO idemgate_records (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    retention_ms, lease_ms, unknown_retention_ms, lease_expires_at, expires_at)
VALUES ('', $1, $2, $3, 'in_flight', 'holder', 1, 3600000, $4, 3600000, now() - interval '1 hour', now() + interval '1 hour')`,
			p.Scope, key, p.Fingerprint, outageLease.Milliseconds()); err != nil {
			t.Fatal(err)
		}
	}
	setStoreMarkBack := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE idemgate_store_state SET resumed_at = now() - interval '1 hour'`); err != nil {
			t.Fatal(err)
		}
	}
	setStoreMarkBack()

	s := pgstore.New(pool, pgstore.WithoutNotify(), pgstore.WithCitus())
	// Each call gets ample time: it fails only if a Begin waits for the
	// cut-off worker.
	bounded := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 2*time.Minute) }

	away.RefuseTCP(t)
	reserved, failed := 0, 0
	for i := range liveKeys {
		bctx, cancel := bounded()
		q := begin("away")
		q.Key = awayKeys[i]
		if res, err := s.Begin(bctx, q); err == nil {
			t.Fatalf("Begin of %s on the cut-off worker = %+v; want an error", q.Key, res)
		}
		q = begin("live")
		q.Key = liveKeys[i]
		res, err := s.Begin(bctx, q)
		cancel()
		if err == nil && res.State == dedupesvc.BeginReserved {
			reserved++
		} else if failed++; failed <= 3 {
			t.Logf("Begin of %s on the live worker = %+v, %v", q.Key, res, err)
		}
	}
	if reserved != len(liveKeys) {
		t.Errorf("while a worker was cut off, %d of %d Begins on the other worker's keys reserved; want all", reserved, len(liveKeys))
	}

	// A gate's follow-up of lost Begins on both workers' keys frees the live
	// worker's while the other is away (the cut-off worker's fail).
	lost := make([]dedupesvc.LostAttempt, 0, len(liveKeys)+1)
	for _, key := range liveKeys {
		lost = append(lost, dedupesvc.LostAttempt{Scope: p.Scope, Key: key, AttemptToken: "live"})
	}
	lost = append(lost, dedupesvc.LostAttempt{Scope: p.Scope, Key: awayKeys[0], AttemptToken: "away"})
	rctx, cancel := bounded()
	released, releaseErr := s.ReleaseLost(rctx, dedupesvc.ReleaseLostParams{Attempts: lost})
	cancel()
	if released != reserved {
		t.Errorf("ReleaseLost of the live worker's %d reserved keys and one cut-off key while a worker was away = %d, %v; want the live ones freed", reserved, released, releaseErr)
	}

	away.AcceptTCP(t)
	// A mark that found the worker away is not made again before its
	// backoff ends: until then its keys fail at once with that error.
	time.Sleep(pgstore.ResumeBackoffCapForTest)
	back := time.Now()
	q := reexecute(begin("taker"))
	q.Key = reexecuteKey
	bctx, cancel := bounded()
	reexecuted, reexecuteErr := s.Begin(bctx, q)
	cancel()
	setStoreMarkBack()
	// A replica that saw no failure.
	taker := pgstore.New(c.OpenPool(t, schema), pgstore.WithoutNotify(), pgstore.WithCitus())
	q = begin("taker")
	q.Key = failClosedKey
	bctx, cancel = bounded()
	failedClosed, failClosedErr := taker.Begin(bctx, q)
	resolveErr := taker.Resolve(bctx, dedupesvc.ResolveParams{Scope: q.Scope, Key: resolveKey})
	cancel()
	if since := time.Since(back); since >= outageLease {
		t.Skipf("the checks ended %v after the worker was back, past the grace its mark grants", since)
	}
	if reexecuteErr != nil || reexecuted.State != dedupesvc.BeginInFlight {
		t.Errorf("REEXECUTE Begin through the replica that saw the outage, once the worker is back = %+v, %v; want in flight (the grace)", reexecuted, reexecuteErr)
	}
	if failClosedErr != nil || failedClosed.State != dedupesvc.BeginInFlight {
		t.Errorf("FAIL_CLOSED Begin through a replica that saw nothing = %+v, %v; want in flight (the worker's mark)", failedClosed, failClosedErr)
	}
	if !errors.Is(resolveErr, dedupesvc.ErrNotUnknown) {
		t.Errorf("Resolve through a replica that saw nothing = %v; want %v (the worker's mark)", resolveErr, dedupesvc.ErrNotUnknown)
	}
}

package pgstore_test

import (
	"testing"

	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// TestTheSweeperGivesAHolderOneMoreLease: the sweeper marks a FAIL_CLOSED
// holder's record outcome-unknown only one full lease past its lease's end,
// so a holder that lost its renewals for a moment (partitioned from its
// replica, reconnecting) is not listed as dead while it may come back.
func TestTheSweeperGivesAHolderOneMoreLease(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	var upMS int64
	if err := pool.QueryRow(ctx, `SELECT (extract(epoch FROM now() - pg_postmaster_start_time()) * 1000)::bigint`).Scan(&upMS); err != nil || upMS < 150000 {
		t.Fatalf("PostgreSQL started %dms ago (%v): too recently for its restart grace not to hide the lease's end", upMS, err)
	}
	s := pgstore.New(pool)
	p := begin("holder")
	// A one-minute lease that ended 30s ago: within one more lease.
	if _, err := pool.Exec(ctx, `
INSERT INTO idemgate_records (scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    retention_ms, lease_ms, unknown_retention_ms, lease_expires_at, expires_at)
VALUES ($1, $2, $3, 'in_flight', 'holder', 1, 3600000, 60000, 3600000, now() - interval '30 seconds', now() + interval '1 hour')`,
		p.Scope, p.Key, p.Fingerprint); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idemgate_store_state SET resumed_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	if n, err := s.MarkLostOutcomes(ctx, 10); err != nil || n != 0 {
		t.Fatalf("MarkLostOutcomes half a lease past the lease's end = %d, %v; want 0 (one more lease)", n, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idemgate_records SET lease_expires_at = now() - interval '61 seconds'`); err != nil {
		t.Fatal(err)
	}
	if n, err := s.MarkLostOutcomes(ctx, 10); err != nil || n != 1 {
		t.Fatalf("MarkLostOutcomes a lease past the lease's end = %d, %v; want 1", n, err)
	}
}

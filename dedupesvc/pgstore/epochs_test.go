package pgstore_test

import (
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// TestEpochsGrowPastAnOldReplicasEpochs: during a rolling deploy a replica
// not yet upgraded to migration 008 moves a row's epoch to its epoch + 1,
// which the store's sequence never sees. A takeover, a Resolve and a forget
// by an upgraded replica must still give that row a higher epoch, never an
// earlier one of the key's.
func TestEpochsGrowPastAnOldReplicasEpochs(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	s := pgstore.New(pool)
	p := begin("old-holder")
	// Three keys whose old-version holders died, their epochs far above the
	// sequence; the resume and the holder's lease are long past.
	if _, err := pool.Exec(ctx, `
INSERT INTO idemgate_records (scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    retention_ms, lease_ms, lease_expires_at, expires_at)
SELECT $1, k, $2, 'in_flight', 'old-holder', 1000, 3600000, 1, now() - interval '1 hour', now() + interval '1 hour'
FROM unnest(ARRAY['takeover', 'resolve', 'forget']) AS k`, p.Scope, p.Fingerprint); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idemgate_store_state SET resumed_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	taker := reexecute(begin("taker"))
	taker.Key = "takeover"
	if res, err := s.Begin(ctx, taker); err != nil || res.State != dedupesvc.BeginReserved || res.Epoch <= 1000 {
		t.Errorf("REEXECUTE takeover = %+v, %v; want reserved with an epoch above the old replica's 1000", res, err)
	}
	if err := s.Resolve(ctx, dedupesvc.ResolveParams{Scope: p.Scope, Key: "resolve"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ForgetRecord(ctx, dedupesvc.ForgetParams{ID: dedupesvc.RecordID{Scope: p.Scope, Key: "forget"}, Force: true}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"resolve", "forget"} {
		var epoch int64
		if err := pool.QueryRow(ctx, `SELECT epoch FROM idemgate_records WHERE idempotency_key = $1`, key).Scan(&epoch); err != nil || epoch <= 1000 {
			t.Errorf("after %s the key's epoch is %d (%v); want above the old replica's 1000", key, epoch, err)
		}
	}
}

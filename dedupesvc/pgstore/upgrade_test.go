package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// TestUpgradeMovesTheNamespaceOutOfTheScope writes records the way the
// version before migration 004 did (the caller's name and \x1f in front of
// the scope), migrates, and wants each replayed to its caller through the
// service, and to no one else.
func TestUpgradeMovesTheNamespaceOutOfTheScope(t *testing.T) {
	t.Parallel()
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// An unreachable server fails the test under CI=true (pgtest).
	pool, _ := pgtest.EmptySchema(t)
	namespaceMigration := migratedBefore(c, t, pool, 4)
	if namespaceMigration.Version != 4 {
		t.Fatal("no migration 004")
	}
	fp := begin("x").Fingerprint
	old := func(stored, key, value string) {
		t.Helper()
		if _, err := pool.Exec(c, `INSERT INTO idemgate_records (scope, idempotency_key, fingerprint, state, attempt_token, epoch,
			outcome_type_url, outcome_value, retention_ms, lease_expires_at, expires_at, completed_at)
			VALUES ($1, $2, $3, 'completed', 't-old', 1, 'type.googleapis.com/x.Y', $4::bytea, 3600000, now(), now() + interval '1 hour', now())`,
			stored, key, fp, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}
	old("svc-a\x1f/pkg.S/M|tenant", "k1", "outcome of svc-a")
	old("/pkg.S/M|tenant", "k1", "outcome without a caller")
	old("svc-b\x1f/pkg.S/M", "k1", "outcome of svc-b")

	applied, err := pgstore.Migrate(c, pool)
	if err != nil || len(applied) == 0 {
		t.Fatalf("Migrate = %v, %v", applied, err)
	}
	s := pgstore.New(pool)
	replay := func(ns, scope string) string {
		t.Helper()
		res, err := s.Begin(c, dedupesvc.BeginParams{Namespace: ns, Scope: scope, Key: "k1", Fingerprint: fp, AttemptToken: "t-new", Lease: time.Minute, Retention: time.Hour, UnknownRetention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if res.State != dedupesvc.BeginCompleted {
			return res.State.String()
		}
		return string(res.Outcome.Value)
	}
	for _, tc := range []struct{ ns, scope, want string }{
		{"svc-a", "/pkg.S/M|tenant", "outcome of svc-a"},
		{"", "/pkg.S/M|tenant", "outcome without a caller"},
		{"svc-b", "/pkg.S/M", "outcome of svc-b"},
		{"svc-b", "/pkg.S/M|tenant", "reserved"},
	} {
		if got := replay(tc.ns, tc.scope); got != tc.want {
			t.Errorf("after the upgrade, namespace %q scope %q replays %q, want %q", tc.ns, tc.scope, got, tc.want)
		}
	}
	// Safe to re-run: running 004 again changes nothing.
	m := namespaceMigration
	if _, err := pool.Exec(c, m.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("re-running %s: %v", m.Name, err)
	}
	if got := replay("svc-a", "/pkg.S/M|tenant"); got != "outcome of svc-a" {
		t.Errorf("after re-running %s: %q", m.Name, got)
	}
}

// TestUpgradeAddsReplayCounts writes a completed record the way the version
// before migration 007 did, migrates, and wants it to replay as before, to
// read zero replays, and to count the next ones; re-running 007 is safe.
func TestUpgradeAddsReplayCounts(t *testing.T) {
	t.Parallel()
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// An unreachable server fails the test under CI=true (pgtest).
	pool, _ := pgtest.EmptySchema(t)
	replayMigration := migratedBefore(c, t, pool, 7)
	if replayMigration.Version != 7 {
		t.Fatal("no migration 007")
	}
	fp := begin("x").Fingerprint
	if _, err := pool.Exec(c, `INSERT INTO idemgate_records (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
		outcome_type_url, outcome_value, retention_ms, lease_expires_at, expires_at, completed_at)
		VALUES ('svc-a', '/pkg.S/M', 'k1', $1, 'completed', 't-old', 1, 'type.googleapis.com/x.Y', 'old outcome'::bytea, 3600000, now(), now() + interval '1 hour', now())`, fp); err != nil {
		t.Fatal(err)
	}
	if _, err := pgstore.Migrate(c, pool); err != nil {
		t.Fatal(err)
	}
	s := pgstore.New(pool)
	id := dedupesvc.RecordID{Namespace: "svc-a", Scope: "/pkg.S/M", Key: "k1"}
	res, err := s.Begin(c, dedupesvc.BeginParams{Namespace: id.Namespace, Scope: id.Scope, Key: id.Key, Fingerprint: fp, AttemptToken: "t-new", Lease: time.Minute, Retention: time.Hour, UnknownRetention: time.Hour})
	if err != nil || res.State != dedupesvc.BeginCompleted || string(res.Outcome.Value) != "old outcome" {
		t.Fatalf("after the upgrade: %+v, %v; want the old outcome replayed", res, err)
	}
	r, found, err := s.GetRecord(c, id)
	if err != nil || !found || r.ReplayCount != 0 || !r.LastReplayedAt.IsZero() {
		t.Fatalf("the old record after the upgrade: %+v, %v, %v; want 0 replays, none dated", r, found, err)
	}
	if _, err := pool.Exec(c, replayMigration.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("re-running %s: %v", replayMigration.Name, err)
	}
	if n, err := s.AddReplays(c, []dedupesvc.ReplayCount{{ID: id, CompletedAt: res.CompletedAt, Count: 1}}); err != nil || n != 1 {
		t.Fatalf("AddReplays = %d, %v", n, err)
	}
	if r, _, _ := s.GetRecord(c, id); r.ReplayCount != 1 || r.LastReplayedAt.IsZero() {
		t.Fatalf("after one counted replay: %d, last %v", r.ReplayCount, r.LastReplayedAt)
	}
}

// TestUpgradeKeepsEpochsGrowing writes records the way the version before
// migration 008 did (epochs counted per key, no unknown retention), migrates,
// and wants the completed one replayed, the old in-flight one whose lease
// and retention ran out expiring as it did, every new epoch above every
// epoch stored before, and a re-run of 008 (and 009) never moving epochs
// back.
func TestUpgradeKeepsEpochsGrowing(t *testing.T) {
	t.Parallel()
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// An unreachable server fails the test under CI=true (pgtest).
	pool, _ := pgtest.EmptySchema(t)
	epochMigration := migratedBefore(c, t, pool, 8)
	if epochMigration.Version != 8 {
		t.Fatal("no migration 008")
	}
	fp := begin("x").Fingerprint
	if _, err := pool.Exec(c, `INSERT INTO idemgate_records (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
		outcome_type_url, outcome_value, retention_ms, lease_expires_at, expires_at, completed_at)
		VALUES ('svc-a', '/pkg.S/M', 'k1', $1, 'completed', 't-old', 7, 'type.googleapis.com/x.Y', 'old outcome'::bytea, 3600000, now(), now() + interval '1 hour', now())`, fp); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(c, `INSERT INTO idemgate_records (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
		retention_ms, lease_ms, lease_expires_at, expires_at, created_at)
		VALUES ('svc-a', '/pkg.S/M', 'k2', $1, 'in_flight', 't-dead', 3, 1000, 1, now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour')`, fp); err != nil {
		t.Fatal(err)
	}
	if _, err := pgstore.Migrate(c, pool); err != nil {
		t.Fatal(err)
	}
	s := pgstore.New(pool)
	params := func(key, token string) dedupesvc.BeginParams {
		return dedupesvc.BeginParams{Namespace: "svc-a", Scope: "/pkg.S/M", Key: key, Fingerprint: fp, AttemptToken: token, Lease: time.Minute, Retention: time.Hour, UnknownRetention: time.Hour}
	}
	res, err := s.Begin(c, params("k1", "t-new"))
	if err != nil || res.State != dedupesvc.BeginCompleted || string(res.Outcome.Value) != "old outcome" {
		t.Fatalf("after the upgrade: %+v, %v; want the old outcome replayed", res, err)
	}
	// Migrating marked the store resumed: wait out the dead holder's
	// grace of one (1ms) lease.
	time.Sleep(20 * time.Millisecond)
	last := int64(7)
	for _, key := range []string{"k2", "k3"} { // the old expired in-flight record, a fresh key
		res, err := s.Begin(c, params(key, "t-new"))
		if err != nil || res.State != dedupesvc.BeginReserved || res.Epoch <= last {
			t.Fatalf("Begin(%s) after the upgrade = %+v, %v; want reserved with an epoch above %d", key, res, err, last)
		}
		last = res.Epoch
	}
	if _, err := pool.Exec(c, `UPDATE idemgate_records SET epoch = 1 WHERE idempotency_key = 'k3'`); err != nil {
		t.Fatal(err)
	}
	all, err := pgstore.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		if m.Version < epochMigration.Version {
			continue
		}
		if _, err := pool.Exec(c, m.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatalf("re-running %s: %v", m.Name, err)
		}
	}
	if res, err := s.Begin(c, params("k4", "t-new")); err != nil || res.State != dedupesvc.BeginReserved || res.Epoch <= last {
		t.Fatalf("Begin after re-running %s = %+v, %v; want an epoch above %d", epochMigration.Name, res, err, last)
	}
}

// migratedBefore applies every migration before version to pool's empty
// schema and records them, as the version that shipped without it left the
// database, and returns the migration numbered version (zero when there is
// none) for the test to re-run.
func migratedBefore(ctx context.Context, t *testing.T, pool *pgxpool.Pool, version int64) pgstore.Migration {
	t.Helper()
	all, err := pgstore.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE idemgate_schema_migrations (version bigint PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		if m.Version >= version {
			if m.Version == version {
				return m
			}
			break
		}
		if _, err := pool.Exec(ctx, m.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO idemgate_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
	}
	return pgstore.Migration{}
}

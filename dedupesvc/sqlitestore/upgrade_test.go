package sqlitestore_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	"github.com/idemgate/idemgate/migrations"
)

// TestUpgradeMovesTheNamespaceOutOfTheScope writes records the way the
// version before migration 003 did (the caller's name and \x1f in front of
// the scope), opens the store, which migrates, and wants each replayed to its
// caller and to no one else.
func TestUpgradeMovesTheNamespaceOutOfTheScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, db := migratedBefore(ctx, t, 3)
	fp := make([]byte, 32)
	now := time.Now().UnixMilli()
	for _, r := range []struct{ stored, value string }{
		{"svc-a\x1f/pkg.S/M|tenant", "outcome of svc-a"},
		{"/pkg.S/M|tenant", "outcome without a caller"},
		{"svc-b\x1f/pkg.S/M", "outcome of svc-b"},
	} {
		if _, err := db.ExecContext(ctx, `INSERT INTO idemgate_records (scope, idempotency_key, fingerprint, state, attempt_token, epoch,
			outcome_type_url, outcome_value, retention_ms, lease_expires_at, expires_at, created_at, completed_at)
			VALUES (?, 'k1', ?, 'completed', 't-old', 1, 'type.googleapis.com/x.Y', ?, 3600000, ?, ?, ?, ?)`,
			r.stored, fp, []byte(r.value), now, now+3600000, now, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	s, err := sqlitestore.Open(ctx, dir)
	if err != nil {
		t.Fatalf("Open (migrating): %v", err)
	}
	defer s.Close()
	for _, tc := range []struct{ ns, scope, want string }{
		{"svc-a", "/pkg.S/M|tenant", "outcome of svc-a"},
		{"", "/pkg.S/M|tenant", "outcome without a caller"},
		{"svc-b", "/pkg.S/M", "outcome of svc-b"},
		{"svc-b", "/pkg.S/M|tenant", "reserved"},
	} {
		res, err := s.Begin(ctx, dedupesvc.BeginParams{Namespace: tc.ns, Scope: tc.scope, Key: "k1", Fingerprint: fp, AttemptToken: "t-new", Lease: time.Minute, Retention: time.Hour, UnknownRetention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		got := res.State.String()
		if res.State == dedupesvc.BeginCompleted {
			got = string(res.Outcome.Value)
		}
		if got != tc.want {
			t.Errorf("after the upgrade, namespace %q scope %q replays %q, want %q", tc.ns, tc.scope, got, tc.want)
		}
	}
}

// TestUpgradeAddsReplayCounts writes a completed record the way the version
// before migration 006 did, opens the store (which migrates), and wants it
// replayed as before, read with zero replays, and counting the next ones.
func TestUpgradeAddsReplayCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, db := migratedBefore(ctx, t, 6)
	fp := make([]byte, 32)
	now := time.Now().UnixMilli()
	if _, err := db.ExecContext(ctx, `INSERT INTO idemgate_records (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
		outcome_type_url, outcome_value, retention_ms, lease_expires_at, expires_at, created_at, completed_at)
		VALUES ('svc-a', '/pkg.S/M', 'k1', ?, 'completed', 't-old', 1, 'type.googleapis.com/x.Y', ?, 3600000, ?, ?, ?, ?)`,
		fp, []byte("old outcome"), now, now+3600000, now, now); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	s, err := sqlitestore.Open(ctx, dir)
	if err != nil {
		t.Fatalf("Open (migrating): %v", err)
	}
	defer s.Close()
	id := dedupesvc.RecordID{Namespace: "svc-a", Scope: "/pkg.S/M", Key: "k1"}
	res, err := s.Begin(ctx, dedupesvc.BeginParams{Namespace: id.Namespace, Scope: id.Scope, Key: id.Key, Fingerprint: fp, AttemptToken: "t-new", Lease: time.Minute, Retention: time.Hour, UnknownRetention: time.Hour})
	if err != nil || res.State != dedupesvc.BeginCompleted || string(res.Outcome.Value) != "old outcome" {
		t.Fatalf("after the upgrade: %+v, %v; want the old outcome replayed", res, err)
	}
	if r, found, err := s.GetRecord(ctx, id); err != nil || !found || r.ReplayCount != 0 || !r.LastReplayedAt.IsZero() {
		t.Fatalf("the old record after the upgrade: %+v, %v, %v; want 0 replays, none dated", r, found, err)
	}
	if n, err := s.AddReplays(ctx, []dedupesvc.ReplayCount{{ID: id, CompletedAt: res.CompletedAt, Count: 1}}); err != nil || n != 1 {
		t.Fatalf("AddReplays = %d, %v", n, err)
	}
	if r, _, _ := s.GetRecord(ctx, id); r.ReplayCount != 1 || r.LastReplayedAt.IsZero() {
		t.Fatalf("after one counted replay: %d, last %v", r.ReplayCount, r.LastReplayedAt)
	}
}

// TestUpgradeKeepsEpochsGrowing writes records the way the version before
// migration 007 did (epochs counted per key, no unknown retention), opens the
// store (which migrates), and wants the completed one replayed, the old
// in-flight one whose lease and retention ran out expiring as it did, and
// every new epoch above every epoch stored before.
func TestUpgradeKeepsEpochsGrowing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, db := migratedBefore(ctx, t, 7)
	fp := make([]byte, 32)
	now := time.Now().UnixMilli()
	if _, err := db.ExecContext(ctx, `INSERT INTO idemgate_records (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
		outcome_type_url, outcome_value, retention_ms, lease_expires_at, expires_at, created_at, completed_at)
		VALUES ('svc-a', '/pkg.S/M', 'k1', ?, 'completed', 't-old', 7, 'type.googleapis.com/x.Y', ?, 3600000, ?, ?, ?, ?)`,
		fp, []byte("old outcome"), now, now+3600000, now, now); err != nil {
		t.Fatal(err)
	}
	hourAgo := now - 3600000
	if _, err := db.ExecContext(ctx, `INSERT INTO idemgate_records (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
		retention_ms, lease_ms, lease_expires_at, expires_at, created_at)
		VALUES ('svc-a', '/pkg.S/M', 'k2', ?, 'in_flight', 't-dead', 3, 1000, 1, ?, ?, ?)`, fp, hourAgo, hourAgo, hourAgo); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	s, err := sqlitestore.Open(ctx, dir)
	if err != nil {
		t.Fatalf("Open (migrating): %v", err)
	}
	defer s.Close()
	params := func(key string) dedupesvc.BeginParams {
		return dedupesvc.BeginParams{Namespace: "svc-a", Scope: "/pkg.S/M", Key: key, Fingerprint: fp, AttemptToken: "t-new", Lease: time.Minute, Retention: time.Hour, UnknownRetention: time.Hour}
	}
	res, err := s.Begin(ctx, params("k1"))
	if err != nil || res.State != dedupesvc.BeginCompleted || string(res.Outcome.Value) != "old outcome" {
		t.Fatalf("after the upgrade: %+v, %v; want the old outcome replayed", res, err)
	}
	// Migrating marked the store resumed: wait out the dead holder's
	// grace of one (1ms) lease.
	time.Sleep(20 * time.Millisecond)
	last := int64(7)
	for _, key := range []string{"k2", "k3"} { // the old expired in-flight record, a fresh key
		res, err := s.Begin(ctx, params(key))
		if err != nil || res.State != dedupesvc.BeginReserved || res.Epoch <= last {
			t.Fatalf("Begin(%s) after the upgrade = %+v, %v; want reserved with an epoch above %d", key, res, err, last)
		}
		last = res.Epoch
	}
}

// migratedBefore returns a new store directory whose database has every
// migration before version applied, as the version that shipped without it
// left the file, and the database open on it for planting old records.
func migratedBefore(ctx context.Context, t *testing.T, version int64) (string, *sql.DB) {
	t.Helper()
	dir := t.TempDir()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, sqlitestore.FileName))
	if err != nil {
		t.Fatal(err)
	}
	all, err := migrations.List(migrations.SQLite, "sqlite")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE idemgate_schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		if m.Version >= version {
			break
		}
		if _, err := db.ExecContext(ctx, m.SQL); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO idemgate_schema_migrations VALUES (?, ?, 0)`, m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
	}
	return dir, db
}

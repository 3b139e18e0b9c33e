package pgstore_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// The store as deployments run it (docs/operating.md): as a runtime role
// that may not change the schema, and behind a PgBouncer in transaction
// pooling mode.

// openPool opens a pool on url, closed when the test ends.
func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// runListener runs l until the test ends.
func runListener(t *testing.T, l *pgstore.Listener) *pgstore.Listener {
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// TestConformanceAsRuntimeRole runs the whole suite as a role granted only
// what pgstore.GrantRuntimeRole grants, on a schema another role owns and
// migrated.
func TestConformanceAsRuntimeRole(t *testing.T) {
	storetest.RunWithNotifier(t, func(t *testing.T) dedupesvc.Store {
		roles := pgtest.NewRoles(t)
		return pgstore.New(openPool(t, roles.RuntimeURL(t)), pgstore.WithChannel(roles.Schema))
	}, listener)
}

// TestRuntimeRoleCannotChangeTheSchema: the runtime role's grants allow no
// DDL; Migrate as that role does nothing when the schema is current, and
// when it is not, says to migrate as the owner.
func TestRuntimeRoleCannotChangeTheSchema(t *testing.T) {
	t.Parallel()
	roles := pgtest.NewRoles(t)
	runtime := openPool(t, roles.RuntimeURL(t))
	for _, ddl := range []string{
		"CREATE TABLE idemgate_extra (id int)",
		"ALTER TABLE idemgate_records ADD COLUMN extra int",
		"DROP TABLE idemgate_usage_changes",
		"TRUNCATE idemgate_records",
		"CREATE INDEX idemgate_extra_idx ON idemgate_records (created_at)",
		"DELETE FROM idemgate_schema_migrations",
		"CREATE OR REPLACE FUNCTION idemgate_count_usage() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'",
	} {
		_, err := runtime.Exec(ctx, ddl)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("as the runtime role, %s: %v, want insufficient_privilege (42501)", ddl, err)
		}
	}
	applied, err := pgstore.Migrate(ctx, runtime)
	if err != nil || len(applied) != 0 {
		t.Fatalf("Migrate as the runtime role on a current schema: applied %v, %v; want nothing, no error", applied, err)
	}

	// A schema one migration behind: the owner removes the last version row.
	owner := roles.DirectPool(t, roles.Owner, roles.Schema)
	all, _ := pgstore.Migrations()
	last := all[len(all)-1]
	if _, err := owner.Exec(ctx, "DELETE FROM idemgate_schema_migrations WHERE version = $1", last.Version); err != nil {
		t.Fatal(err)
	}
	_, err = pgstore.Migrate(ctx, runtime)
	if err == nil || !strings.Contains(err.Error(), "run `dedupesvc migrate` as the schema's owner") || !strings.Contains(err.Error(), last.Name) {
		t.Fatalf("Migrate as the runtime role on a schema missing %s: %v; want a refusal saying to migrate as the owner", last.Name, err)
	}
}

// bouncerURL is the shared server's database through b as role, with the
// settings docs/operating.md gives for transaction pooling.
func bouncerURL(t *testing.T, b *pgtest.Bouncer, role string, params url.Values) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	return b.URL(role, cfg.Database, params)
}

// TestConformanceBehindPgBouncer runs the whole suite through a PgBouncer
// in transaction pooling mode, as the runtime role, with the URL
// docs/operating.md gives (default_query_exec_mode=exec) and the listener
// on a direct connection, as -listen-database-url gives it.
func TestConformanceBehindPgBouncer(t *testing.T) {
	bouncer := pgtest.NewBouncer(t)
	storetest.RunWithNotifier(t, func(t *testing.T) dedupesvc.Store {
		roles := pgtest.NewRoles(t)
		pool := openPool(t, bouncerURL(t, bouncer, roles.Runtime, url.Values{"default_query_exec_mode": {"exec"}}))
		return pgstore.New(pool, pgstore.WithChannel(roles.Schema))
	}, func(t *testing.T, s dedupesvc.Store) dedupesvc.Notifier {
		store := s.(*pgstore.Store)
		direct, err := pgx.ParseConfig(pgtest.URL())
		if err != nil {
			t.Fatal(err)
		}
		return runListener(t, pgstore.NewListener(store.Pool(), store.Channel(), slog.Default(), pgstore.ListenOn(direct)))
	})
}

// logRecorder is a slog.Handler that keeps the messages of warnings.
type logRecorder struct {
	mu       sync.Mutex
	warnings []string
}

func (r *logRecorder) Enabled(_ context.Context, level slog.Level) bool {
	return level >= slog.LevelWarn
}
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.warnings = append(r.warnings, rec.Message)
	return nil
}
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

func (r *logRecorder) warned(substring string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.warnings {
		if strings.Contains(w, substring) {
			return true
		}
	}
	return false
}

// TestListenerBehindPgBouncerSaysNotificationsAreLost: a LISTEN through a
// transaction-pooling PgBouncer holds for its statement only. The Listener
// must not claim to be healthy (the service would then poll ten times less
// often, trusting notifications that never come), and must say what to do.
func TestListenerBehindPgBouncerSaysNotificationsAreLost(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.NewBouncer(t)
	roles := pgtest.NewRoles(t)
	pool := openPool(t, bouncerURL(t, bouncer, roles.Runtime, url.Values{"default_query_exec_mode": {"exec"}}))
	logs := &logRecorder{}
	l := pgstore.NewListener(pool, roles.Schema, slog.New(logs))
	pgstore.ProbeEveryForTest(l, 500*time.Millisecond)
	runListener(t, l)
	deadline := time.Now().Add(time.Minute)
	for !logs.warned("-listen-database-url") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning within a minute; Healthy() = %v, warnings %q", l.Healthy(), logs.warnings)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if l.Healthy() {
		t.Fatal("the Listener behind PgBouncer reports itself healthy though its notifications are lost")
	}
}

// TestListenerOnADirectConnectionBehindPgBouncer: with ListenOn (the
// service's -listen-database-url) the Listener hears the changes a Store
// behind PgBouncer announces, and says it is healthy.
func TestListenerOnADirectConnectionBehindPgBouncer(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.NewBouncer(t)
	roles := pgtest.NewRoles(t)
	pool := openPool(t, bouncerURL(t, bouncer, roles.Runtime, url.Values{"default_query_exec_mode": {"exec"}}))
	s := pgstore.New(pool, pgstore.WithChannel(roles.Schema))
	direct, err := pgx.ParseConfig(roles.RuntimeURL(t))
	if err != nil {
		t.Fatal(err)
	}
	logs := &logRecorder{}
	l := runListener(t, pgstore.NewListener(pool, roles.Schema, slog.New(logs), pgstore.ListenOn(direct)))
	deadline := time.Now().Add(time.Minute)
	for !l.Healthy() {
		if time.Now().After(deadline) {
			t.Fatalf("the Listener on a direct connection is not healthy after a minute; warnings %q", logs.warnings)
		}
		time.Sleep(20 * time.Millisecond)
	}
	epoch := mustReserve(t, s)
	woken, unsubscribe := l.Subscribe(ctx, dedupesvc.RecordID{Scope: "/pkg.S/M", Key: "key-1"})
	defer unsubscribe()
	if err := s.Release(ctx, dedupesvc.ReleaseParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: "t1", Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woken:
	case <-time.After(time.Minute):
		t.Fatal("no notification within a minute")
	}
}

// TestConnectionsToADemotedPrimaryAreDropped: after a failover that moves a
// DNS name, the pool's connections may still reach the old primary, now a
// read-only standby, which refuses every write (SQLSTATE 25006) and would
// go on refusing until each connection reached its maximum lifetime. The
// store drops the pool's connections at the first such refusal, so the next
// statement connects anew (and, with target_session_attrs=read-write, only
// to a writable server). Modelled with the runtime role: its sessions are
// read-only while the pool opens its connections, writable afterwards.
func TestConnectionsToADemotedPrimaryAreDropped(t *testing.T) {
	t.Parallel()
	roles := pgtest.NewRoles(t)
	admin := openPool(t, pgtest.URL())
	if _, err := admin.Exec(ctx, "ALTER ROLE "+roles.Runtime+" SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	pool := openPool(t, roles.RuntimeURL(t))
	conns := make([]*pgxpool.Conn, pool.Config().MaxConns)
	for i := range conns { // every connection the pool may hold, opened read-only
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
	if _, err := admin.Exec(ctx, "ALTER ROLE "+roles.Runtime+" RESET default_transaction_read_only"); err != nil {
		t.Fatal(err)
	}
	s := pgstore.New(pool, pgstore.WithChannel(roles.Schema))
	_, err := s.Begin(ctx, begin("t1"))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Fatalf("Begin on a read-only connection: %v, want read_only_sql_transaction (25006)", err)
	}
	if res, err := s.Begin(ctx, begin("t1")); err != nil || res.State != dedupesvc.BeginReserved {
		t.Fatalf("the Begin after a read-only refusal = %+v, %v; want reserved on a fresh connection", res, err)
	}
}

package pgtest

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc/pgstore"
)

// Roles is a schema on the shared server owned by a role of its own
// (Owner), which migrated it, and a runtime role (Runtime) with only what
// pgstore.GrantRuntimeRole grants, whose search_path selects the schema (a
// role setting, so it holds behind a transaction-pooling PgBouncer, where a
// connection's own settings do not).
type Roles struct {
	// Schema is the migrated schema.
	Schema string
	// Owner owns the schema and applied the migrations.
	Owner string
	// Runtime is the least-privileged role the service runs as.
	Runtime string
}

// NewRoles creates the schema and both roles, migrates as the owner and
// grants the runtime role; all are dropped when the test ends. Both roles
// log in without a password (the local server trusts loopback).
func NewRoles(tb testing.TB) Roles {
	tb.Helper()
	r := NewEmptyRoles(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	owner := r.DirectPool(tb, r.Owner, r.Schema)
	if _, err := pgstore.Migrate(ctx, owner); err != nil {
		tb.Fatalf("pgtest: migrate as %s: %v", r.Owner, err)
	}
	if _, err := pgstore.GrantRuntimeRole(ctx, owner, r.Runtime); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return r
}

// NewEmptyRoles is NewRoles without the migrations and the grants: the
// owner's schema is empty and the runtime role may not use it.
func NewEmptyRoles(tb testing.TB) Roles {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, URL())
	if err != nil {
		unreachable(tb, err)
	}
	defer admin.Close(ctx)
	reapOnce.Do(func() { reapSchemas(tb, admin, schemaPrefix) })
	schema := schemaName(ownPrefix)
	r := Roles{Schema: schema, Owner: schema + "_owner", Runtime: schema + "_runtime"}
	for _, role := range []string{r.Owner, r.Runtime} {
		if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
			tb.Fatalf("pgtest: create role: %v", err)
		}
	}
	// Registered first, so it runs last, after the pools are closed.
	tb.Cleanup(func() {
		dropSchema(tb, schema)
		checkDropped(tb, schema)
		dropRoles(tb, r.Owner, r.Runtime)
	})
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema+" AUTHORIZATION "+r.Owner); err != nil {
		tb.Fatalf("pgtest: create schema: %v", err)
	}
	if _, err := admin.Exec(ctx, "ALTER ROLE "+r.Runtime+" SET search_path = "+schema); err != nil {
		tb.Fatalf("pgtest: set the runtime role's search_path: %v", err)
	}
	return r
}

// OwnerURL returns the URL of the shared server's database as the owner,
// selecting the schema (search_path).
func (r Roles) OwnerURL(tb testing.TB) string {
	tb.Helper()
	u, err := url.Parse(userURL(tb, URL(), r.Owner))
	if err != nil {
		tb.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", r.Schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// RuntimeURL returns the URL of the shared server's database as the runtime
// role, with its own search_path (none in the URL).
func (r Roles) RuntimeURL(tb testing.TB) string {
	tb.Helper()
	return userURL(tb, URL(), r.Runtime)
}

// DirectPool opens a pool on the shared server as role, with search_path
// schema ("" leaves the role's own), closed when the test ends.
func (r Roles) DirectPool(tb testing.TB, role, schema string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(userURL(tb, URL(), role))
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: open pool as %s: %v", role, err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// userURL is raw with its user replaced by role and no password.
func userURL(tb testing.TB, raw, role string) string {
	tb.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		tb.Fatalf("pgtest: parse %s: %v", raw, err)
	}
	u.User = url.User(role)
	return u.String()
}

func dropRoles(tb testing.TB, roles ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		tb.Errorf("pgtest: drop roles %v: %v", roles, err)
		return
	}
	defer conn.Close(ctx)
	for _, role := range roles {
		// DROP OWNED removes the role's grants in this database; roles are
		// cluster-wide, so one left over would outlive the test process.
		if _, err := conn.Exec(ctx, "DROP OWNED BY "+role); err != nil && !isUndefinedObject(err) {
			tb.Errorf("pgtest: drop owned by %s: %v", role, err)
		}
		if _, err := conn.Exec(ctx, "DROP ROLE IF EXISTS "+role); err != nil {
			tb.Errorf("pgtest: drop role %s: %v", role, err)
		}
	}
}

func isUndefinedObject(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42704"
}

package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/migrations"
)

// Migration is one numbered SQL file of migrations/postgres.
type Migration = migrations.Migration

// Migrations returns the embedded PostgreSQL migrations in version order.
func Migrations() ([]Migration, error) {
	return migrations.List(migrations.Postgres, "postgres")
}

// createVersionsSQL makes the table that records which migrations ran. A
// plain table and a primary key instead of an advisory lock: two migrators
// racing collide on the key, and the loser finds the version applied.
const createVersionsSQL = `
CREATE TABLE IF NOT EXISTS idemgate_schema_migrations (
    version    bigint      PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`

// Migrate applies every embedded migration the database lacks, each in its
// own transaction together with its version row, and returns the names of
// those it applied. It is safe to run from several processes at once. When
// none is missing it only reads the migrations table, so a runtime role that
// may not run DDL (GrantRuntimeRole) can call it; when some are missing and
// the role may not apply them, the error says to run them as the schema's
// owner.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	pending, err := Pending(ctx, pool)
	if err != nil {
		return nil, err
	}
	if len(pending) == 0 {
		return nil, nil
	}
	applied, err := migrate(ctx, pool)
	if err != nil && isInsufficientPrivilege(err) {
		return applied, fmt.Errorf("%w; this role may not change the schema: run `dedupesvc migrate` as the schema's owner (pending: %s), then start the service again", err, strings.Join(pending, ", "))
	}
	return applied, err
}

func migrate(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	all, err := Migrations()
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, createVersionsSQL); err != nil {
		// Two first-ever migrators can collide creating the table itself.
		if _, retryErr := pool.Exec(ctx, createVersionsSQL); retryErr != nil {
			return nil, fmt.Errorf("pgstore: create migrations table: %w", err)
		}
	}
	var applied []string
	for _, m := range all {
		ran, err := applyOne(ctx, pool, m)
		if err != nil {
			return applied, err
		}
		if ran {
			applied = append(applied, m.Name)
		}
	}
	again, err := citusPending(ctx, pool)
	if err != nil || !again {
		return applied, err
	}
	// A schema migrated before the citus extension was installed ran
	// the Citus migration as a no-op: run it again, now that it
	// distributes the tables.
	for _, m := range all {
		if strings.HasSuffix(m.Name, citusMigrationSuffix) {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, m.SQL, pgx.QueryExecModeSimpleProtocol)
				return err
			})
			if err != nil {
				return applied, fmt.Errorf("pgstore: apply migration %s again, for citus: %w", m.Name, err)
			}
			applied = append(applied, m.Name)
		}
	}
	return applied, nil
}

// citusMigrationSuffix names the migration that distributes the schema on
// a Citus coordinator (013_citus.sql).
const citusMigrationSuffix = "_citus.sql"

// citusPending reports whether the citus extension is installed while the
// records are not distributed: the schema ran the Citus migration before
// citus was installed (a single-node database made a Citus coordinator),
// so Migrate runs it again.
func citusPending(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	installed, distributed, err := citusState(ctx, pool)
	return installed && !distributed, err
}

// citusState reports whether the citus extension is installed in the
// database, and whether idemgate_records (of the search_path) is a
// distributed table. Without the extension it asks nothing of Citus's
// catalog, which does not exist then.
func citusState(ctx context.Context, pool *pgxpool.Pool) (installed, distributed bool, err error) {
	err = pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&installed)
	if err != nil || !installed {
		return false, false, wrapCitusErr(err)
	}
	err = pool.QueryRow(ctx, `
SELECT to_regclass('idemgate_records') IS NOT NULL
   AND EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('idemgate_records'))`).Scan(&distributed)
	return true, distributed, wrapCitusErr(err)
}

func wrapCitusErr(err error) error {
	if err != nil {
		return fmt.Errorf("pgstore: check citus: %w", err)
	}
	return nil
}

// Pending returns the names of the embedded migrations the database lacks,
// in order, reading the migrations table only; all of them when it has none.
func Pending(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	status, err := Status(ctx, pool)
	if err != nil {
		return nil, err
	}
	var pending []string
	for _, m := range status {
		if !m.Applied {
			pending = append(pending, m.Name)
		}
	}
	if len(pending) == 0 {
		again, err := citusPending(ctx, pool)
		if err != nil {
			return nil, err
		}
		for _, m := range status {
			if again && strings.HasSuffix(m.Name, citusMigrationSuffix) {
				pending = append(pending, m.Name)
			}
		}
	}
	return pending, nil
}

// isInsufficientPrivilege reports a statement refused for the role's lack
// of a privilege (SQLSTATE 42501).
func isInsufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

func applyOne(ctx context.Context, pool *pgxpool.Pool, m Migration) (bool, error) {
	done, err := isApplied(ctx, pool, m.Version)
	if err != nil || done {
		return false, err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, m.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO idemgate_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
		return err
	})
	if err == nil {
		return true, nil
	}
	// Another migrator may have applied it meanwhile; that is success.
	if done, checkErr := isApplied(ctx, pool, m.Version); checkErr == nil && done {
		return false, nil
	}
	return false, fmt.Errorf("pgstore: apply migration %s: %w", m.Name, err)
}

func isApplied(ctx context.Context, pool *pgxpool.Pool, version int64) (bool, error) {
	var one int
	err := pool.QueryRow(ctx, `SELECT 1 FROM idemgate_schema_migrations WHERE version = $1`, version).Scan(&one)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("pgstore: read migration versions: %w", err)
	}
	return true, nil
}

// MigrationStatus is one migration and whether the database has it.
type MigrationStatus struct {
	Migration
	// Applied reports whether the database has run it.
	Applied bool
}

// Status reports every embedded migration and whether the database has it.
func Status(ctx context.Context, pool *pgxpool.Pool) ([]MigrationStatus, error) {
	all, err := Migrations()
	if err != nil {
		return nil, err
	}
	out := make([]MigrationStatus, 0, len(all))
	for _, m := range all {
		done, err := isApplied(ctx, pool, m.Version)
		if err != nil {
			var pgErr interface{ SQLState() string }
			if errors.As(err, &pgErr) && pgErr.SQLState() == "42P01" { // undefined_table: nothing applied yet
				done = false
			} else {
				return nil, err
			}
		}
		out = append(out, MigrationStatus{Migration: m, Applied: done})
	}
	return out, nil
}

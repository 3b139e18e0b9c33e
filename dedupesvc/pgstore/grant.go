package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// storeObjectsSQL lists the store's tables, sequences and functions in the
// current schema (where Migrate made them) as GRANT targets: relation kind
// ('r' table, 'p' partitioned table, 'S' sequence, 'f' function) and the
// quoted name. The migrations table is listed apart (kind 'm'): the
// service only reads it.
const storeObjectsSQL = `
SELECT CASE WHEN c.relname = 'idemgate_schema_migrations' THEN 'm' ELSE c.relkind::text END, quote_ident(c.relname)
FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'S') AND starts_with(c.relname, 'idemgate_')
UNION ALL
SELECT 'f', quote_ident(p.proname) || '(' || pg_get_function_identity_arguments(p.oid) || ')'
FROM pg_proc p
WHERE p.pronamespace = current_schema()::regnamespace AND starts_with(p.proname, 'idemgate_')
ORDER BY 1, 2`

// GrantRuntimeRole grants role what the Dedupe service needs at run time on
// the schema Migrate wrote (the pool's current schema), and nothing more:
// USAGE on the schema; SELECT, INSERT, UPDATE and DELETE on the store's
// tables; SELECT only on the migrations table (the service reads it at
// start to refuse a schema that lacks migrations); USAGE on its sequences;
// EXECUTE on its functions. No CREATE, TRUNCATE, REFERENCES or TRIGGER, and
// no ownership: the role cannot change the schema. Run it as the schema's
// owner after Migrate, and again after every Migrate that adds a table
// (`dedupesvc migrate -grant-runtime-role NAME` does both). It is
// idempotent and returns the statements it ran.
func GrantRuntimeRole(ctx context.Context, pool *pgxpool.Pool, role string) ([]string, error) {
	if role == "" {
		return nil, fmt.Errorf("pgstore: grant: no role named")
	}
	grantee := pgx.Identifier{role}.Sanitize()
	var schema string
	if err := pool.QueryRow(ctx, `SELECT quote_ident(current_schema())`).Scan(&schema); err != nil {
		return nil, fmt.Errorf("pgstore: grant: read the current schema: %w", err)
	}
	rows, err := pool.Query(ctx, storeObjectsSQL)
	if err != nil {
		return nil, fmt.Errorf("pgstore: grant: list the store's objects: %w", err)
	}
	type object struct{ kind, name string }
	objects, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (object, error) {
		var o object
		return o, row.Scan(&o.kind, &o.name)
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: grant: list the store's objects: %w", err)
	}
	if len(objects) == 0 {
		return nil, fmt.Errorf("pgstore: grant: schema %s holds no idemgate tables: run Migrate (dedupesvc migrate) first", schema)
	}
	statements := []string{fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", schema, grantee)}
	for _, o := range objects {
		name := schema + "." + o.name
		switch o.kind {
		case "r", "p":
			statements = append(statements, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %s TO %s", name, grantee))
		case "m":
			statements = append(statements, fmt.Sprintf("GRANT SELECT ON TABLE %s TO %s", name, grantee))
		case "S":
			statements = append(statements, fmt.Sprintf("GRANT USAGE ON SEQUENCE %s TO %s", name, grantee))
		case "f":
			statements = append(statements, fmt.Sprintf("GRANT EXECUTE ON FUNCTION %s TO %s", name, grantee))
		}
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, stmt := range statements {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("%s: %w", stmt, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: grant to %s: %w", role, err)
	}
	return statements, nil
}

package dedupeapp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// CreateDatabase creates the PostgreSQL database databaseURL names, unless
// it exists, and reports whether it created it. It connects to the same
// server as the same user, to its maintenance database "postgres", so the
// user needs the CREATEDB right (the postgres superuser has it); the new
// database is the user's, with the server's default encoding and template.
// `dedupesvc create-database` and `make run-postgres` run it.
func CreateDatabase(ctx context.Context, databaseURL string) (bool, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return false, fmt.Errorf("-database-url: not a PostgreSQL URL: %w", err)
	}
	name := cfg.Database
	// pgx leaves the database empty when the URL names none; PostgreSQL
	// would then take the user's name, which is not what the URL says.
	if name == "" {
		return false, errors.New("-database-url names no database: add it after the host, postgres://user@host:5432/NAME")
	}
	cfg.Database = "postgres"
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return false, fmt.Errorf("-database-url: connect to the server's postgres database to create %q: %w", name, err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return false, fmt.Errorf("look for database %q: %w", name, err)
	}
	if exists {
		return false, nil
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42P04" {
			return false, nil // duplicate_database: created by another at the same time
		}
		return false, fmt.Errorf("create database %q (the user needs the CREATEDB right, or create it yourself): %w", name, err)
	}
	return true, nil
}

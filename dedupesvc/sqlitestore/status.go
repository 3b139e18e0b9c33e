package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"

	"github.com/idemgate/idemgate/migrations"
)

// MigrationStatus is one embedded migration and whether the store has it.
type MigrationStatus struct {
	migrations.Migration
	// Applied reports whether the store has run it.
	Applied bool
}

// StatusReport is what Status found in a data directory.
type StatusReport struct {
	// Path is the database file.
	Path string
	// Exists reports whether the file exists; when it does not, every
	// migration is pending.
	Exists bool
	// Migrations lists every embedded migration in version order.
	Migrations []MigrationStatus
}

// Status reports which migrations the store in dir has applied, and changes
// nothing: unlike Open it creates neither the directory nor the file, takes
// no lock (so it runs beside the service) and opens the file read-only, so
// it migrates nothing and marks nothing resumed.
func Status(ctx context.Context, dir string) (StatusReport, error) {
	path := filepath.Join(dir, FileName)
	report := StatusReport{Path: path}
	all, err := migrations.List(migrations.SQLite, "sqlite")
	if err != nil {
		return report, err
	}
	applied := map[int64]bool{}
	switch _, err := os.Stat(path); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return report, explainOpenError(dir, path, fmt.Errorf("sqlitestore: %w", err))
	default:
		report.Exists = true
		if applied, err = appliedVersions(ctx, path); err != nil {
			return report, explainOpenError(dir, path, err)
		}
	}
	for _, m := range all {
		report.Migrations = append(report.Migrations, MigrationStatus{Migration: m, Applied: applied[m.Version]})
	}
	return report, nil
}

// appliedVersions reads the migrations table of the database at path,
// opened read-only. A database in WAL mode whose -wal file is missing has no
// writer and nothing outside the main file, so it is opened immutable: SQLite
// then creates no -wal or -shm file beside it. With a -wal file (the service
// runs, or crashed), SQLite reads it through the existing -shm.
func appliedVersions(ctx context.Context, path string) (map[int64]bool, error) {
	q := url.Values{}
	q.Set("mode", "ro")
	if _, err := os.Stat(path + "-wal"); errors.Is(err, os.ErrNotExist) {
		q.Set("immutable", "1")
	}
	q.Add("_pragma", "busy_timeout(10000)")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: open %s read-only: %w", path, err)
	}
	defer db.Close()
	var table int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'idemgate_schema_migrations'`).Scan(&table); err != nil {
		return nil, fmt.Errorf("sqlitestore: read %s: %w", path, err)
	}
	applied := map[int64]bool{}
	if table == 0 {
		return applied, nil
	}
	rows, err := db.QueryContext(ctx, `SELECT version FROM idemgate_schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: read %s: %w", path, err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		applied[v] = true
	}
	return applied, rows.Err()
}

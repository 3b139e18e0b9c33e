// Package migrations holds the numbered SQL migrations of the PostgreSQL
// store, embedded so the dedupesvc binary carries its own schema. Files are
// named NNN_name.sql and applied in number order; each is safe to re-run.
package migrations

import "embed"

// FS holds every NNN_name.sql migration file.
//
//go:embed *.sql
var FS embed.FS

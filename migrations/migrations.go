// Package migrations holds the numbered SQL migrations of each store,
// embedded so the dedupesvc binary carries its own schema: postgres/ for
// PostgreSQL (and the SQL it shares with CockroachDB), sqlite/ for the
// embedded store. Files are named NNN_name.sql and applied in number order;
// each is safe to re-run.
package migrations

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Postgres holds postgres/NNN_name.sql.
//
//go:embed postgres/*.sql
var Postgres embed.FS

// SQLite holds sqlite/NNN_name.sql.
//
//go:embed sqlite/*.sql
var SQLite embed.FS

// Migration is one numbered SQL file.
type Migration struct {
	// Version is the file's number prefix.
	Version int64
	// Name is the file name, without its folder.
	Name string
	// SQL is the file's content.
	SQL string
}

// List returns the migrations in dir of fsys in version order, and an error
// for a file not named NNN_name.sql or two files with one version.
func List(fsys fs.FS, dir string) ([]Migration, error) {
	names, err := fs.Glob(fsys, path.Join(dir, "*.sql"))
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, full := range names {
		name := path.Base(full)
		prefix, _, ok := strings.Cut(name, "_")
		version, err := strconv.ParseInt(prefix, 10, 64)
		if !ok || err != nil || version <= 0 {
			return nil, fmt.Errorf("migrations: %q is not named NNN_name.sql", full)
		}
		body, err := fs.ReadFile(fsys, full)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: version, Name: name, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migrations: %q and %q share version %d", out[i-1].Name, out[i].Name, out[i].Version)
		}
	}
	return out, nil
}

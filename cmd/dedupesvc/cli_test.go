package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// runCLI runs the command line with DATABASE_URL unset (the embedded store)
// and returns its exit code, stdout and stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	t.Setenv("DATABASE_URL", "")
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestHelpListsTheCommands(t *testing.T) {
	code, _, stderr := runCLI(t, "-h")
	if code != 0 {
		t.Errorf("-h exited %d, want 0", code)
	}
	for _, want := range []string{"dedupesvc [flags] migrate ", "dedupesvc [flags] migrate status", "-data-dir"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("-h printed:\n%s\nwant it to mention %q", stderr, want)
		}
	}
}

func TestUnknownCommandIsRefused(t *testing.T) {
	code, _, stderr := runCLI(t, "-data-dir", t.TempDir(), "migrat")
	if code != 2 || !strings.Contains(stderr, `unknown command "migrat"`) {
		t.Errorf("exit %d, stderr %q; want 2 and the unknown command named", code, stderr)
	}
}

// The flags may come before the command as well as after it.
func TestFlagsBeforeTheCommand(t *testing.T) {
	for _, args := range [][]string{
		{"-data-dir", "DIR", "migrate", "status"},
		{"migrate", "-data-dir", "DIR", "status"},
		{"migrate", "status", "-data-dir", "DIR"},
	} {
		dir := filepath.Join(t.TempDir(), "data")
		for i := range args {
			if args[i] == "DIR" {
				args[i] = dir
			}
		}
		code, stdout, stderr := runCLI(t, args...)
		if code != 0 || !strings.Contains(stdout, filepath.Join(dir, sqlitestore.FileName)) {
			t.Errorf("dedupesvc %q: exit %d, stdout %q, stderr %q; want the status of the store in %s", args, code, stdout, stderr, dir)
		}
	}
}

// migrate status reads the embedded store without creating or changing it.
func TestMigrateStatusIsReadOnly(t *testing.T) {
	t.Run("no database", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "data")
		code, stdout, stderr := runCLI(t, "migrate", "status", "-data-dir", dir)
		if code != 0 || !strings.Contains(stdout, "database does not exist") || !strings.Contains(stdout, "pending ") || strings.Contains(stdout, "applied ") {
			t.Errorf("exit %d, stdout %q, stderr %q; want the database reported missing and every migration pending", code, stdout, stderr)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("migrate status created %s (stat: %v)", dir, err)
		}
	})
	t.Run("existing database", func(t *testing.T) {
		dir := t.TempDir()
		s, err := sqlitestore.Open(context.Background(), dir)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		path := filepath.Join(dir, sqlitestore.FileName)
		before, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		content, _ := os.ReadFile(path)
		code, stdout, stderr := runCLI(t, "migrate", "status", "-data-dir", dir)
		if code != 0 || !strings.Contains(stdout, "applied ") || strings.Contains(stdout, "pending ") {
			t.Errorf("exit %d, stdout %q, stderr %q; want every migration applied", code, stdout, stderr)
		}
		after, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		now, _ := os.ReadFile(path)
		if !after.ModTime().Equal(before.ModTime()) || !bytes.Equal(content, now) {
			t.Errorf("migrate status modified %s", path)
		}
		for _, suffix := range []string{"-wal", "-shm"} {
			if _, err := os.Stat(path + suffix); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("migrate status left %s%s (stat: %v)", path, suffix, err)
			}
		}
	})
}

// migrate -grant-runtime-role, run by the schema's owner, leaves a runtime
// role that can serve and cannot change the schema.
func TestMigrateGrantsTheRuntimeRole(t *testing.T) {
	roles := pgtest.NewEmptyRoles(t)
	code, stdout, stderr := runCLI(t, "migrate", "-database-url", roles.OwnerURL(t), "-grant-runtime-role", roles.Runtime)
	if code != 0 || !strings.Contains(stdout, "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "+roles.Schema+".idemgate_records TO "+`"`+roles.Runtime+`"`) {
		t.Fatalf("migrate -grant-runtime-role exited %d:\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	t.Logf("migrate -grant-runtime-role %s granted:\n%s", roles.Runtime, stdout)
	runtime := roles.DirectPool(t, roles.Runtime, "")
	ctx := context.Background()
	if _, err := runtime.Exec(ctx, "SELECT resumed_at FROM idemgate_store_state"); err != nil {
		t.Fatalf("the runtime role reads the store: %v", err)
	}
	if _, err := runtime.Exec(ctx, "CREATE TABLE idemgate_extra (id int)"); err == nil {
		t.Fatal("the runtime role created a table")
	}
	if code, _, stderr := runCLI(t, "-database-url", roles.OwnerURL(t), "-grant-runtime-role", roles.Runtime); code != 2 || !strings.Contains(stderr, "for the migrate command") {
		t.Fatalf("serving with -grant-runtime-role exited %d (%s), want 2 and a refusal", code, stderr)
	}
}

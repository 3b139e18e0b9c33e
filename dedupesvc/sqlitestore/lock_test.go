package sqlitestore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
)

// A second Open of one store is refused while the first holds it, naming the
// holder; once the first closes, the store opens again.
func TestSecondOpenIsRefusedNamingTheHolder(t *testing.T) {
	t.Parallel()
	if runtime.GOOS == "windows" {
		t.Skip("the lock is flock, which Windows lacks")
	}
	ctx := context.Background()
	dir := t.TempDir()
	first, err := sqlitestore.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	second, err := sqlitestore.Open(ctx, dir)
	if err == nil {
		second.Close()
		t.Fatal("a second Open of a store in use succeeded; want it refused")
	}
	var locked *sqlitestore.LockedError
	if !errors.As(err, &locked) {
		t.Fatalf("second Open: %v, want a *LockedError", err)
	}
	for _, want := range []string{fmt.Sprintf("pid %d on host ", os.Getpid()), filepath.Join(dir, sqlitestore.FileName), "stop that process"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("second Open: %q, want it to say %q", err, want)
		}
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := sqlitestore.Open(ctx, dir)
	if err != nil {
		t.Fatalf("Open after the holder closed: %v", err)
	}
	again.Close()
}

// snapshot is every file in dir with its content and modification time.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		content, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = fmt.Sprintf("%s %o %x", fi.ModTime(), fi.Mode(), content)
	}
	return files
}

func sameFiles(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for name, v := range a {
		if b[name] != v {
			return false
		}
	}
	return true
}

// Status reads without creating or changing anything: no directory or file
// where there was none, and not a byte or a modification time changed in an
// existing store, closed or in use.
func TestStatusChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("no database", func(t *testing.T) {
		t.Parallel()
		dir := filepath.Join(t.TempDir(), "data")
		report, err := sqlitestore.Status(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		if report.Exists || len(report.Migrations) == 0 {
			t.Errorf("Status = %+v, want no database and every migration listed", report)
		}
		for _, m := range report.Migrations {
			if m.Applied {
				t.Errorf("%s applied in a database that does not exist", m.Name)
			}
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Status created %s (stat: %v)", dir, err)
		}
	})

	t.Run("closed store", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		s, err := sqlitestore.Open(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, dir)
		report, err := sqlitestore.Status(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		if !report.Exists || len(report.Migrations) == 0 {
			t.Fatalf("Status = %+v, want the database and its migrations", report)
		}
		for _, m := range report.Migrations {
			if !m.Applied {
				t.Errorf("%s pending in a store Open migrated", m.Name)
			}
		}
		if after := snapshot(t, dir); !sameFiles(before, after) {
			t.Errorf("Status changed the data directory:\nbefore %v\nafter  %v", before, after)
		}
	})

	t.Run("store in use", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		s, err := sqlitestore.Open(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		before, err := os.ReadFile(filepath.Join(dir, sqlitestore.FileName))
		if err != nil {
			t.Fatal(err)
		}
		report, err := sqlitestore.Status(ctx, dir)
		if err != nil {
			t.Fatalf("Status beside an open store: %v", err)
		}
		for _, m := range report.Migrations {
			if !m.Applied {
				t.Errorf("%s pending in a store Open migrated", m.Name)
			}
		}
		after, err := os.ReadFile(filepath.Join(dir, sqlitestore.FileName))
		if err != nil || !bytes.Equal(before, after) {
			t.Errorf("Status changed the database file (%v)", err)
		}
	})
}

// Opening a store where the file system refuses names the file and says what
// to do, not only SQLite's "unable to open database file (14)". Tests run as
// root, whom a chmod does not stop: these are refusals that stop root too.
func TestOpenErrorsNameThePathAndTheFix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a parent is a regular file", func(t *testing.T) {
		t.Parallel()
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(file, "data")
		_, err := sqlitestore.Open(ctx, dir)
		if err == nil {
			t.Fatal("Open under a regular file succeeded")
		}
		for _, want := range []string{filepath.Join(dir, sqlitestore.FileName), "is a file, not a directory"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Open: %q, want it to say %q", err, want)
			}
		}
	})

	t.Run("SQLite cannot create its -wal file", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		s, err := sqlitestore.Open(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		// What a directory the process may not write into does to SQLite,
		// for root too: the -wal file cannot be opened.
		if err := os.Mkdir(filepath.Join(dir, sqlitestore.FileName+"-wal"), 0o700); err != nil {
			t.Fatal(err)
		}
		_, err = sqlitestore.Open(ctx, dir)
		if err == nil {
			t.Fatal("Open with an unopenable -wal file succeeded")
		}
		for _, want := range []string{"(14)", filepath.Join(dir, sqlitestore.FileName), "must be able to write", "choose another data directory"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Open: %q, want it to say %q", err, want)
			}
		}
	})

	t.Run("a read-only directory", func(t *testing.T) {
		t.Parallel()
		if os.Geteuid() == 0 {
			t.Skip("root writes into a 0500 directory; cmd/dedupesvc's TestReadOnlyDataDirectory runs this as another user")
		}
		dir := t.TempDir()
		s, err := sqlitestore.Open(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		if err := os.Chmod(dir, 0o500); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(dir, 0o700) })
		_, err = sqlitestore.Open(ctx, dir)
		if err == nil {
			t.Fatal("Open in a read-only directory succeeded")
		}
		for _, want := range []string{filepath.Join(dir, sqlitestore.FileName), "must be able to write"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Open: %q, want it to say %q", err, want)
			}
		}
	})
}

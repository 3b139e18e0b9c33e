package dedupeapp_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/internal/dedupeapp"
)

// The embedded store's files hold every key and outcome: only the service's
// user may read them, whatever the umask. A data directory others can read
// gets a warning.
func TestEmbeddedStoreFilesArePrivate(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	addr, logs := startLogged(t, dedupeapp.Config{DataDir: dir})
	beginOnce(t, addr)
	for _, name := range []string{"dedupe.db", "dedupe.db-wal", "dedupe.db-shm"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if mode := fi.Mode().Perm(); mode != 0o600 {
			t.Errorf("%s has mode %#o, want 0600", name, mode)
		}
	}
	if !strings.Contains(logs.String(), "chmod 700 "+dir) {
		t.Fatalf("no warning about the data directory readable by others:\n%s", logs.String())
	}
}

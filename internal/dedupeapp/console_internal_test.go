package dedupeapp

import (
	"context"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
)

// On the embedded store the console's health check reads the store's
// file, and says where it is.
func TestConsoleHealthOfTheEmbeddedStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store, err := sqlitestore.Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{DataDir: dir}
	health := storeHealth(cfg, backend{store: store})
	if h := health(context.Background()); !h.OK || h.Store != "embedded store (SQLite) in "+dir {
		t.Fatalf("health of an open embedded store: %+v", h)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	if h := health(context.Background()); h.OK || !strings.Contains(h.Detail, "reading it failed") {
		t.Fatalf("health of a closed embedded store: %+v, want it failing to be read", h)
	}
}

package incident_test

import (
	"context"
	"testing"

	"github.com/idemgate/idemgate/internal/incident"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// The README shows the table `make demo` prints with the default seed; the
// replay is deterministic, so the two must agree to the byte, and the demo
// holds its run to the same table (incident.DefaultTable). The table does
// not depend on the store; this runs on PostgreSQL, because the embedded
// store's SQLite (C translated to Go) under the race detector takes minutes
// over 300 orders. TestReplayInvariants covers the embedded store.
func TestReadmeShowsTheDemoTable(t *testing.T) {
	t.Parallel()
	shown := readmeTable(t)
	if shown != incident.DefaultTable {
		t.Errorf("README.md shows:\n%s\nbut incident.DefaultTable, which the demo holds its run to, is:\n%s", shown, incident.DefaultTable)
	}
	r, err := incident.Run(context.Background(), incident.Config{DatabaseURL: pgtest.SchemaURL(t)})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Table(); got != shown {
		t.Errorf("make demo prints:\n%s\nbut README.md shows:\n%s", got, shown)
	}
	if p := r.Problems(); len(p) > 0 {
		t.Errorf("the demo exits 1: %v", p)
	}
}

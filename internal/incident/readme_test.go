package incident_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/internal/incident"
	"github.com/idemgate/idemgate/internal/pgtest"
)

// The README shows the table `make demo` prints with the default seed; the
// replay is deterministic, so the two must agree to the byte. The table does
// not depend on the store; this runs on PostgreSQL, because the embedded
// store's SQLite (C translated to Go) under the race detector takes minutes
// over 300 orders. TestReplayInvariants covers the embedded store.
func TestReadmeShowsTheDemoTable(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const intro = "With the default seed it prints:\n\n```text\n"
	_, rest, ok := strings.Cut(string(readme), intro)
	if !ok {
		t.Fatalf("README.md has no %q block", intro)
	}
	shown, _, _ := strings.Cut(rest, "```")

	r, err := incident.Run(context.Background(), incident.Config{DatabaseURL: pgtest.SchemaURL(t)})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Table(); got != shown {
		t.Errorf("make demo prints:\n%s\nbut README.md shows:\n%s", got, shown)
	}
	if u := r.Unexplained(); len(u) > 0 {
		t.Errorf("actions neither done as promised nor reported not done: %v", u)
	}
}

package incident_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/internal/incident"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// readmeTable is the table README.md shows `make demo` printing.
func readmeTable(t *testing.T) string {
	t.Helper()
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
	return shown
}

// On a machine fast enough to send its Begins faster than the Dedupe
// service's default per-caller rate, the demo prints the same table and
// exits 0: its service must not limit it by a rate its speed can exceed.
// Such a machine is simulated by a service whose default rate is one Begin
// a second (what 500 a second is to a machine 500 times faster).
func TestDemoOnAFastMachine(t *testing.T) {
	t.Parallel()
	cfg := incident.Config{DatabaseURL: pgtest.SchemaURL(t)}
	incident.ServiceDefaults(&cfg, dedupesvc.WithCallerRate(1, 1))
	r, err := incident.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.Table(), readmeTable(t); got != want {
		t.Errorf("on a fast machine make demo prints:\n%s\nbut README.md shows:\n%s", got, want)
	}
	if p := r.Problems(); len(p) > 0 {
		t.Errorf("on a fast machine the demo exits 1: %v", p)
	}
}

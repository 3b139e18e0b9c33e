//go:build citus

package dedupeapp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/citustest"
)

// TestCitusServiceRunsTheCitusForms: a service started on a Citus
// coordinator migrates a fresh schema there (migration 013 distributes
// it), finds it distributed and runs the store's Citus forms.
func TestCitusServiceRunsTheCitusForms(t *testing.T) {
	c := citustest.New(t, 1)
	_, schema := c.EmptySchema(t)
	cfg := Config{DatabaseURL: c.URL() + "&search_path=" + schema, MigrateOnStart: true, Notify: true}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := openBackend(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	s, ok := b.store.(*pgstore.Store)
	if !ok || !s.IsCitus() {
		t.Fatalf("the service's store on a Citus coordinator = %T (Citus forms: %v), want a pgstore.Store WithCitus", b.store, ok && s.IsCitus())
	}
}

// TestCitusConsoleShowsEachWorker: on a Citus coordinator the console's
// store health lists each worker and whether it answers; a stopped worker
// is shown not answering while the coordinator answers.
func TestCitusConsoleShowsEachWorker(t *testing.T) {
	c := citustest.New(t, 2)
	_, schema := c.EmptySchema(t)
	cfg := Config{DatabaseURL: c.URL() + "&search_path=" + schema, MigrateOnStart: true}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := openBackend(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	health := storeHealth(cfg, b)
	h := health(ctx)
	if !h.OK || !strings.HasPrefix(h.Store, "Citus coordinator, PostgreSQL ") || len(h.Nodes) != 2 || !h.Nodes[0].OK || !h.Nodes[1].OK {
		t.Fatalf("health of a well cluster: %+v", h)
	}
	c.Workers[1].Stop(t, "fast")
	// Started again before the schema is dropped (cleanups run last first):
	// dropping it needs every worker.
	t.Cleanup(func() { c.Workers[1].Start(t) })
	h = health(ctx)
	down := fmt.Sprintf("127.0.0.1:%d", c.Workers[1].Port())
	for _, n := range h.Nodes {
		if n.OK == (n.Name == down) {
			t.Fatalf("with worker %s stopped, node %+v", down, n)
		}
	}
	if !h.OK || len(h.Nodes) != 2 {
		t.Fatalf("with a worker stopped the store shows %+v, want the coordinator answering and both workers listed", h)
	}
}

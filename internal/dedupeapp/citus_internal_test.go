//go:build citus

package dedupeapp

import (
	"context"
	"io"
	"log/slog"
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

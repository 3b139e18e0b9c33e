package dedupeapp

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// A freshly started service under load took over 500ms to answer its first
// burst of Begins while its pool opened connections on demand (issue 31):
// the store the service serves from has its whole pool open before Serve
// can say SERVING.
func TestThePoolIsWarmBeforeServing(t *testing.T) {
	const size = 5
	cfg := Config{DatabaseURL: pgtest.SchemaURL(t), MigrateOnStart: true, MaxConns: size}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := openBackend(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	if got := b.pool.Stat().TotalConns(); got != size {
		t.Errorf("open connections when the store is ready = %d, want the whole pool, %d", got, size)
	}
}

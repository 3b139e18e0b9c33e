package embedded_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc/embedded"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// A MetricsListen another process holds is refused, naming the field,
// before the store opens: Start returns while the migrations are held back.
func TestStartRefusesATakenMetricsPortBeforeTheStoreOpens(t *testing.T) {
	t.Parallel()
	databaseURL, schema := pgtest.EmptySchemaURL(t)
	hold := pgtest.HoldMigrations(t, schema)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	started := make(chan error, 1)
	go func() {
		svc, err := embedded.Start(context.Background(), embedded.Config{DatabaseURL: databaseURL, MetricsListen: busy.Addr().String(), Logger: quietLogger()})
		if err == nil {
			svc.Close()
		}
		started <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		var got error
		select {
		case got = <-started:
		case <-ctx.Done():
			t.Fatal("Start did not return")
		case <-time.After(50 * time.Millisecond):
			if n, err := hold.Waiters(ctx); err != nil || n > 0 {
				t.Fatalf("%d sessions wait for the migrations (%v): the store opened before MetricsListen was checked", n, err)
			}
			continue
		}
		want := "embedded: embedded.Config.MetricsListen " + busy.Addr().String() + ": "
		if got == nil || !strings.HasPrefix(got.Error(), want) || !strings.Contains(got.Error(), "address already in use") {
			t.Errorf("Start: %v, want an error starting %q saying the address is in use", got, want)
		}
		return
	}
}

package dedupeapp_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// readinessTimeout bounds each wait of these tests: generous, the machine
// is shared.
const readinessTimeout = 3 * time.Minute

// heldService is the dedupesvc configuration of an empty schema whose
// migrations are held back, serving on free loopback ports.
func heldService(t *testing.T) (dedupeapp.Config, *pgtest.MigrationHold) {
	t.Helper()
	databaseURL, schema := pgtest.EmptySchemaURL(t)
	hold := pgtest.HoldMigrations(t, schema)
	cfg := dedupeapp.Defaults(func(string) string { return "" })
	cfg.DatabaseURL, cfg.MigrateOnStart = databaseURL, true
	cfg.Listen, cfg.MetricsListen = stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	return cfg, hold
}

// waitForWaiter returns once a session waits for hold, and fails the test
// if served returns first.
func waitForWaiter(t *testing.T, hold *pgtest.MigrationHold, served <-chan error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readinessTimeout)
	defer cancel()
	for {
		n, err := hold.Waiters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case err := <-served:
			t.Fatalf("ListenAndServe returned %v before migrating", err)
		case <-ctx.Done():
			t.Fatal("the service never reached the migrations")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// While the migrations are held back the service's ports refuse
// connections; once they are applied it serves, SERVING first.
func TestListenAndServeListensOnlyOnceMigrated(t *testing.T) {
	t.Parallel()
	cfg, hold := heldService(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- dedupeapp.ListenAndServe(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))) }()

	waitForWaiter(t, hold, served)
	for _, addr := range []string{cfg.Listen, cfg.MetricsListen} {
		if conn, err := net.DialTimeout("tcp", addr, 10*time.Second); err == nil {
			_ = conn.Close()
			t.Errorf("%s accepted a connection while the migrations were held back", addr)
		}
	}
	hold.Release(t)

	conn := dial(t, cfg.Listen)
	callCtx, callCancel := context.WithTimeout(context.Background(), readinessTimeout)
	defer callCancel()
	if h, err := healthpb.NewHealthClient(conn).Check(callCtx, &healthpb.HealthCheckRequest{Service: idemgatev1.DedupeService_ServiceDesc.ServiceName}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v; want SERVING", h, err)
	}
	if resp, err := idemgatev1.NewDedupeServiceClient(conn).Begin(callCtx, beginRequest("k")); err != nil || resp.GetReserved() == nil {
		t.Fatalf("Begin = %v, %v; want reserved", resp, err)
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("ListenAndServe: %v", err)
	}
}

// A port another process holds is refused at once, naming its flag: the
// service returns while its migrations are held back, so it did not wait
// for its store to open.
func TestListenAndServeRefusesATakenPortBeforeTheStoreOpens(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"-listen", "-metrics-listen"} {
		t.Run(flag, func(t *testing.T) {
			t.Parallel()
			cfg, hold := heldService(t)
			busy, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer busy.Close()
			if flag == "-listen" {
				cfg.Listen = busy.Addr().String()
			} else {
				cfg.MetricsListen = busy.Addr().String()
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			served := make(chan error, 1)
			go func() { served <- dedupeapp.ListenAndServe(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
			got := returnedBeforeMigrating(t, hold, served)
			want := flag + " " + busy.Addr().String() + ": "
			if got == nil || !strings.HasPrefix(got.Error(), want) || !strings.Contains(got.Error(), "address already in use") {
				t.Errorf("ListenAndServe: %v, want an error starting %q saying the address is in use", got, want)
			}
		})
	}
}

// returnedBeforeMigrating returns what served delivers, and fails the test
// if a session waits for hold first: the service opened its store.
func returnedBeforeMigrating(t *testing.T, hold *pgtest.MigrationHold, served <-chan error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readinessTimeout)
	defer cancel()
	for {
		select {
		case err := <-served:
			return err
		case <-ctx.Done():
			t.Fatal("ListenAndServe did not return")
		case <-time.After(50 * time.Millisecond):
		}
		if n, err := hold.Waiters(ctx); err != nil || n > 0 {
			t.Fatalf("%d sessions wait for the migrations (%v): the store opened before the port was checked", n, err)
		}
	}
}

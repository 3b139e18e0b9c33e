package dedupeapp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// The pool's statistics, and the store's tries while PostgreSQL is away,
// are on /metrics of a service on PostgreSQL. Only
// the names are checked: the values are timings and counts of a shared
// machine.
func TestPoolMetricsExported(t *testing.T) {
	t.Parallel()
	cfg := dedupeapp.Config{DatabaseURL: pgtest.SchemaURL(t), MigrateOnStart: true, MetricsListen: stacktest.FreeAddr(t)}
	addr := stacktest.ServeApp(t, cfg)
	waitServing(t, addr)
	metrics := getMetrics(t, cfg.MetricsListen)
	for _, name := range []string{
		"idemgate_db_pool_acquires_total", "idemgate_db_pool_acquire_seconds_total", "idemgate_db_pool_canceled_acquires_total",
		"idemgate_db_pool_empty_acquires_total", "idemgate_db_pool_empty_acquire_wait_seconds_total", "idemgate_db_pool_new_connections_total",
		"idemgate_db_pool_acquired_connections", "idemgate_db_pool_idle_connections", "idemgate_db_pool_constructing_connections",
		"idemgate_db_pool_total_connections", "idemgate_db_pool_max_connections",
		"idemgate_db_unreachable_tries_total", "idemgate_db_paced_calls_total",
	} {
		if !strings.Contains(metrics, "\n"+name+" ") {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// waitServing waits until the service at addr answers its health check.
func waitServing(t *testing.T, addr string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "idemgate.v1.DedupeService"}, grpc.WaitForReady(true))
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v; want SERVING", h, err)
	}
}

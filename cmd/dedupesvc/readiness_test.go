//go:build faults

// Real dedupesvc processes: in `make faults` with the other real-process
// tests.

package main_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// A TCP readiness check passes only once the service can serve: while
// -migrate-on-start's migrations are held back, neither -listen nor
// -metrics-listen accepts a connection; once they are let go, the service
// answers health SERVING and a Begin.
func TestPortsOpenOnlyOnceMigrationsAreApplied(t *testing.T) {
	t.Parallel()
	databaseURL, schema := pgtest.EmptySchemaURL(t)
	hold := pgtest.HoldMigrations(t, schema)
	addr, metricsAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	svc := proctest.Start(t, proctest.Build(t, dedupesvcPkg),
		[]string{"-listen", addr, "-metrics-listen", metricsAddr, "-migrate-on-start=true", "-database-url", databaseURL}, nil)

	// Dials from the start until the hold is let go. released is read after
	// a dial connects: unset then, the port opened before the release.
	var released atomic.Bool
	early := make(chan string, 1)
	stopDialing := make(chan struct{})
	dialed := make(chan struct{})
	go func() {
		defer close(dialed)
		for {
			for _, a := range []string{addr, metricsAddr} {
				if conn, err := net.DialTimeout("tcp", a, time.Second); err == nil {
					_ = conn.Close()
					if !released.Load() {
						select {
						case early <- a:
						default:
						}
					}
				}
			}
			select {
			case <-stopDialing:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	// The service is opening its store: its migrator waits for the hold.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		n, err := hold.Waiters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if err := svc.Wait(0); err != proctest.ErrStillRunning {
			t.Fatalf("dedupesvc exited (%v) before migrating:\n%s", err, svc.Log())
		}
		select {
		case <-ctx.Done():
			t.Fatalf("dedupesvc never reached the migrations:\n%s", svc.Log())
		case <-time.After(50 * time.Millisecond):
		}
	}
	for _, a := range []string{addr, metricsAddr} {
		if conn, err := net.DialTimeout("tcp", a, 10*time.Second); err == nil {
			_ = conn.Close()
			t.Errorf("%s accepted a connection while the migrations were held back", a)
		}
	}

	released.Store(true)
	hold.Release(t)
	close(stopDialing)
	<-dialed
	select {
	case a := <-early:
		t.Errorf("%s accepted a connection before the migrations were let go", a)
	default:
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "idemgate.v1.DedupeService"}, grpc.WaitForReady(true)); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health after the migrations = %v, %v; want SERVING", h, err)
	}
	if resp, err := begin(idemgatev1.NewDedupeServiceClient(conn), "order-1", "attempt-a"); err != nil || resp.GetReserved() == nil {
		t.Fatalf("Begin = %v, %v; want reserved", resp, err)
	}
	log := svc.Log()
	if applied, serving := strings.Index(log, `msg="migrations applied"`), strings.Index(log, `msg="dedupe service serving"`); applied < 0 || serving < applied {
		t.Errorf("log:\n%s\nwant the migrations applied, then the service serving", log)
	}
	if err := svc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := svc.Wait(time.Minute); err != nil {
		t.Fatalf("dedupesvc exited with %v after SIGTERM, want 0", err)
	}
}

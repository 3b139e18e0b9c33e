//go:build unix

package dedupeapp

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// On the embedded store, too, the service listens only once its store is
// open: the file locked to this process and every migration applied. (The
// PostgreSQL path is held back mid-migration in readiness_test.go; the
// embedded store offers no such hold, so its order is read at the listen.)
func TestServeListensOnlyOnceTheEmbeddedStoreIsOpen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := Defaults(func(string) string { return "" })
	cfg.DataDir, cfg.MetricsListen = dir, ""
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listened := make(chan string, 1)
	served := make(chan error, 1)
	go func() {
		served <- serve(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), func() (net.Listener, error) {
			var locked *sqlitestore.LockedError
			if s, err := sqlitestore.Open(context.Background(), dir); !errors.As(err, &locked) {
				if s != nil {
					_ = s.Close()
				}
				t.Errorf("at the listen, opening the store again: %v; want it locked by the service", err)
			}
			report, err := sqlitestore.Status(context.Background(), dir)
			if err != nil || !report.Exists || len(report.Migrations) == 0 {
				t.Errorf("at the listen, the store's migrations: %+v, %v", report, err)
			}
			for _, m := range report.Migrations {
				if !m.Applied {
					t.Errorf("at the listen, migration %s is not applied", m.Name)
				}
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err == nil {
				listened <- lis.Addr().String()
			}
			return lis, err
		})
	}()
	var addr string
	select {
	case addr = <-listened:
	case err := <-served:
		t.Fatalf("serve returned %v before listening", err)
	case <-time.After(3 * time.Minute):
		t.Fatal("serve never listened")
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	callCtx, callCancel := context.WithTimeout(context.Background(), time.Minute)
	defer callCancel()
	if h, err := healthpb.NewHealthClient(conn).Check(callCtx, &healthpb.HealthCheckRequest{Service: idemgatev1.DedupeService_ServiceDesc.ServiceName}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v; want SERVING", h, err)
	}
	fp := sha256.Sum256([]byte("r"))
	if resp, err := idemgatev1.NewDedupeServiceClient(conn).Begin(callCtx, &idemgatev1.BeginRequest{Scope: "/x.S/M", Key: "k", Fingerprint: fp[:],
		AttemptToken: "a", Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)}); err != nil || resp.GetReserved() == nil {
		t.Fatalf("Begin = %v, %v; want reserved", resp, err)
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// checkListen refuses what net.Listen refuses and passes what it takes, for
// each form of address, on a port another socket listens on and on a free
// one.
func TestCheckListenAgreesWithListen(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, busyPort, _ := net.SplitHostPort(busy.Addr().String())
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, freePort, _ := net.SplitHostPort(free.Addr().String())
	_ = free.Close()
	for _, port := range []string{busyPort, freePort} {
		for _, host := range []string{"127.0.0.1", "", "0.0.0.0", "localhost", "::1", "::"} {
			addr := net.JoinHostPort(host, port)
			checked := checkListen(context.Background(), addr)
			lis, listened := net.Listen("tcp", addr)
			if lis != nil {
				_ = lis.Close()
			}
			if (checked == nil) != (listened == nil) {
				t.Errorf("%s: checkListen %v, net.Listen %v; want both to pass or both to fail", addr, checked, listened)
			}
			if checked != nil && listened != nil && checked.Error() != listened.Error() {
				t.Errorf("%s: checkListen says %q, net.Listen %q; want the same", addr, checked, listened)
			}
		}
	}
}

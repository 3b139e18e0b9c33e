package stacktest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/dedupeapp"
)

// FreeAddr returns a loopback address that was free a moment ago.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// ServeApp runs the dedupesvc application (dedupeapp.Serve) on a loopback
// port until the test ends and returns its address. Zero fields of cfg take
// test-sized values; set DataDir or DatabaseURL to choose the store.
func ServeApp(tb testing.TB, cfg dedupeapp.Config) string {
	tb.Helper()
	addr, stop := StartApp(tb, cfg)
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Errorf("dedupeapp.Serve: %v", err)
		}
	})
	return addr
}

// StartApp is ServeApp for a test that stops the service itself: stop ends
// Serve's context and returns what Serve returned. Call it once.
func StartApp(tb testing.TB, cfg dedupeapp.Config) (addr string, stop func() error) {
	tb.Helper()
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = time.Minute
	}
	if cfg.SweepBatch == 0 {
		cfg.SweepBatch = 100
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 100 * time.Millisecond
	}
	if cfg.UnknownRetention == 0 {
		cfg.UnknownRetention = time.Hour
	}
	if cfg.MaxOutcomeBytes == 0 {
		cfg.MaxOutcomeBytes = 1 << 20
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- dedupeapp.Serve(ctx, cfg, lis, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	return lis.Addr().String(), func() error {
		cancel()
		return <-served
	}
}

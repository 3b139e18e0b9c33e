package dedupeapp_test

// Tests of issue 11: the Dedupe service is shared infrastructure, so one
// careless or hostile caller must not hurt another.

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc/auth"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/testlog"
)

const (
	clientSecret = "payments-secret-0123456789"
	adminSecret  = "ops-admin-secret-0123456789"
)

// logBuffer is a slog destination a test can read while the service runs.
type logBuffer struct{ testlog.Buffer }

// startLogged is stacktest.StartApp with the service's log captured.
func startLogged(t *testing.T, cfg dedupeapp.Config) (addr string, logs *logBuffer) {
	t.Helper()
	if cfg.DataDir == "" && cfg.DatabaseURL == "" {
		cfg.DataDir = t.TempDir()
	}
	cfg.SweepInterval, cfg.SweepBatch, cfg.ShutdownTimeout = time.Minute, 100, 5*time.Second
	cfg.PollInterval, cfg.UnknownRetention, cfg.MaxOutcomeBytes = 100*time.Millisecond, time.Hour, 1<<20
	logs = &logBuffer{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- dedupeapp.Serve(ctx, cfg, lis, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("dedupeapp.Serve: %v", err)
		}
	})
	return lis.Addr().String(), logs
}

// writeTokens writes a token file of mode 0600.
func writeTokens(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

// tokenFile returns a token file with a client (payments) and an admin (ops).
func tokenFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, "payments client "+clientSecret+"\nops admin "+adminSecret+"\n")
	return path
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func withToken(secret string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(auth.BearerToken(secret, true))
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func beginRequest(key string) *idemgatev1.BeginRequest {
	fp := sha256.Sum256([]byte("r"))
	return &idemgatev1.BeginRequest{Scope: "/x.S/M", Key: key, Fingerprint: fp[:], AttemptToken: "a",
		Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)}
}

// wantRefusal fails unless err has code and reason, and, when field is not
// empty, names field in its ErrorInfo.
func wantRefusal(t *testing.T, err error, code codes.Code, reason, field string) {
	t.Helper()
	if status.Code(err) != code || grpcerr.Reason(err) != reason {
		t.Fatalf("got %v (reason %q), want %s %s", err, grpcerr.Reason(err), code, reason)
	}
	if field == "" {
		return
	}
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetMetadata()["field"] == field {
			return
		}
	}
	t.Fatalf("%v: ErrorInfo does not name the field %q", err, field)
}

// eventually polls cond, bounded, and fails with what if it never holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1200 {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("never: %s", what)
}

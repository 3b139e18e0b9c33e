package dedupeapp_test

import (
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/dedupeapp"
)

// An embedded service is the one Serve runs, minus the gRPC server: its
// caller limits come from the Config, and Close stores the replay counts
// not yet flushed.
func TestEmbedServesInProcessWithTheConfigsLimits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg, err := dedupeapp.ParseConfig("embedded", []string{"-data-dir", dir, "-metrics-listen=", "-replay-flush-interval=1h",
		"-caller-begin-rate=0.001", "-caller-begin-burst=3"}, cliflag.Map(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	e, err := dedupeapp.Embed(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	client := e.Client()
	fp := sha256.Sum256([]byte("r"))
	begin := func(token string) (*idemgatev1.BeginResponse, error) {
		return client.Begin(ctx, &idemgatev1.BeginRequest{Scope: "/pkg.S/M", Key: "k1", Fingerprint: fp[:], AttemptToken: token,
			Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)})
	}
	res, err := begin("t1")
	if err != nil || res.GetReserved() == nil {
		t.Fatalf("first Begin: %v, %v; want reserved", res, err)
	}
	if _, err := client.Finish(ctx, &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: "k1", AttemptToken: "t1", Epoch: res.GetReserved().GetEpoch(),
		Outcome: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: []byte("v")}}); err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"t2", "t3"} {
		if res, err := begin(token); err != nil || res.GetCompleted() == nil {
			t.Fatalf("Begin %s: %v, %v; want a replay", token, res, err)
		}
	}
	if _, err := begin("t4"); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a fourth Begin past -caller-begin-burst=3: %v, want RESOURCE_EXHAUSTED", err)
	}
	e.Close()
	wantReplayCount(t, dir, "k1", 2, "after Close")
}

// What only a gRPC server can apply is refused, naming the flag, not
// silently dropped: a token file would otherwise look like protection.
func TestEmbedRefusesServerOnlySettings(t *testing.T) {
	t.Parallel()
	_, err := dedupeapp.Embed(context.Background(), dedupeapp.Config{DataDir: t.TempDir(), TokenFile: "/nonexistent", Reflection: true},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "-token-file") || !strings.Contains(err.Error(), "-reflection") {
		t.Fatalf("Embed with -token-file and -reflection: %v, want both refused by name", err)
	}
}

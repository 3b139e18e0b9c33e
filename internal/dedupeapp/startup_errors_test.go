package dedupeapp_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/dedupeapp"
)

// Flags may come before, between and after the command's words.
func TestParseArgsTakesFlagsAroundTheCommand(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-data-dir", "/x", "migrate", "status"},
		{"migrate", "-data-dir", "/x", "status"},
		{"migrate", "status", "-data-dir", "/x"},
	} {
		cfg, words, err := dedupeapp.ParseArgs("dedupesvc", "", args, cliflag.Map(nil), io.Discard)
		if err != nil || cfg.DataDir != "/x" || !reflect.DeepEqual(words, []string{"migrate", "status"}) {
			t.Errorf("ParseArgs(%q) = data dir %q, words %q, %v; want /x, [migrate status]", args, cfg.DataDir, words, err)
		}
	}
}

// -h prints the command synopsis the binary gives, then the flags.
func TestUsageListsTheCommands(t *testing.T) {
	t.Parallel()
	var usage bytes.Buffer
	_, _, err := dedupeapp.ParseArgs("dedupesvc", "Commands:\n  migrate status   list migrations\n", []string{"-h"}, cliflag.Map(nil), &usage)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	out := usage.String()
	if !strings.Contains(out, "migrate status   list migrations") || !strings.Contains(out, "-data-dir") {
		t.Errorf("usage:\n%s\nwant the commands and the flags", out)
	}
}

// A bad environment variable is reported by the one rule of cliflag (the
// variable, its value, then the flag it feeds), and does not matter when
// the flag itself is given.
func TestEnvironmentErrorsNameTheirFlag(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ env, value, flag string }{
		{"IDEMGATE_SHUTDOWN_TIMEOUT", "soon", "-shutdown-timeout"},
		{"IDEMGATE_AUTH_REFUSAL_LOG_RATE", "fast", "-auth-refusal-log-rate"},
		{"IDEMGATE_SWEEP_BATCH", "many", "-sweep-batch"},
		{"IDEMGATE_NOTIFY", "perhaps", "-notify"},
	} {
		getenv := cliflag.Map(map[string]string{tt.env: tt.value})
		_, err := dedupeapp.ParseConfig("dedupesvc", nil, getenv, io.Discard)
		if want := fmt.Sprintf("%s=%q (%s): ", tt.env, tt.value, tt.flag); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s=%s: %v, want an error starting %s", tt.env, tt.value, err, want)
		}
		if _, err := dedupeapp.ParseConfig("dedupesvc", []string{tt.flag + "=" + map[string]string{
			"-shutdown-timeout": "5s", "-auth-refusal-log-rate": "2", "-sweep-batch": "10", "-notify": "true"}[tt.flag]}, getenv, io.Discard); err != nil {
			t.Errorf("%s=%s with %s given: %v, want the flag to win", tt.env, tt.value, tt.flag, err)
		}
	}
}

// The dedupesvc variables follow cliflag's rule: each is parsed as its flag
// is (IDEMGATE_CALLER_BEGIN_RATE takes a fraction, as -caller-begin-rate
// does), and every one that does not parse is reported, with its flag.
func TestEnvironmentFollowsTheOneRule(t *testing.T) {
	t.Parallel()
	env := map[string]string{"IDEMGATE_CALLER_BEGIN_RATE": "2.5", "DATABASE_URL": "postgres://db/x", "OTEL_EXPORTER_OTLP_ENDPOINT": "127.0.0.1:4317"}
	cfg, err := dedupeapp.ParseConfig("dedupesvc", nil, cliflag.Map(env), io.Discard)
	if err != nil || cfg.CallerBeginRate != 2.5 || cfg.DatabaseURL != "postgres://db/x" || cfg.OTLPEndpoint != "127.0.0.1:4317" {
		t.Errorf("rate %v, database %q, OTLP %q, %v; want 2.5 and the two documented names read", cfg.CallerBeginRate, cfg.DatabaseURL, cfg.OTLPEndpoint, err)
	}
	bad := map[string]string{"IDEMGATE_CALLER_BEGIN_RATE": "fast", "IDEMGATE_SWEEP_INTERVAL": "x"}
	_, err = dedupeapp.ParseConfig("dedupesvc", nil, cliflag.Map(bad), io.Discard)
	for _, want := range []string{`IDEMGATE_CALLER_BEGIN_RATE="fast" (-caller-begin-rate): `, `IDEMGATE_SWEEP_INTERVAL="x" (-sweep-interval): `} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("two bad variables: %v, want both reported, %s among them", err, want)
		}
	}
	var usage bytes.Buffer
	if _, err := dedupeapp.ParseConfig("dedupesvc", []string{"-h"}, cliflag.Map(nil), &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"(env IDEMGATE_CALLER_BEGIN_RATE)", "(env DATABASE_URL)", "(env OTEL_EXPORTER_OTLP_ENDPOINT)", "(env IDEMGATE_LOG_LEVEL)"} {
		if strings.Count(usage.String(), want) != 1 {
			t.Errorf("usage:\n%s\nwant %s once", usage.String(), want)
		}
	}
}

// What fails at start-up (opening the store, listening) names the flag that
// fixes it.
func TestStartupErrorsNameTheirFlag(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("tool client short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tt := range []struct {
		name string
		cfg  dedupeapp.Config
		want string
	}{
		{"data directory under a file", dedupeapp.Config{DataDir: filepath.Join(file, "data")}, "-data-dir " + filepath.Join(file, "data") + ": "},
		{"unparsable database URL", dedupeapp.Config{DatabaseURL: "postgres://a b@/%zz"}, "-database-url: "},
		{"unreachable database", dedupeapp.Config{DatabaseURL: "postgres://postgres@127.0.0.1:1/x?connect_timeout=5"}, "-database-url (DATABASE_URL): "},
		{"a token too short", dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokens}, "-token-file " + tokens + ": "},
		{"metrics address in use", dedupeapp.Config{DataDir: t.TempDir(), MetricsListen: busy.Addr().String()}, "-metrics-listen " + busy.Addr().String() + ": "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer lis.Close()
			cfg := tt.cfg
			cfg.Listen, cfg.SweepInterval, cfg.SweepBatch, cfg.ShutdownTimeout, cfg.PollInterval, cfg.UnknownRetention, cfg.MaxOutcomeBytes =
				lis.Addr().String(), 1e9, 1, 1e9, 1e8, 1e12, 1<<20
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			err = dedupeapp.Serve(ctx, cfg, lis, quiet)
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("Serve: %v, want an error starting %q", err, tt.want)
			}
		})
	}
}

// A variable set to the empty string is its flag given empty, as
// docs/service.md says: IDEMGATE_METRICS_LISTEN= turns the endpoint off as
// -metrics-listen= does, and IDEMGATE_SWEEP_INTERVAL= is refused as
// -sweep-interval= is; unset, each keeps its default.
func TestAnEmptyVariableIsItsFlagGivenEmpty(t *testing.T) {
	cfg, err := dedupeapp.ParseConfig("dedupesvc", nil, cliflag.Map(map[string]string{"IDEMGATE_METRICS_LISTEN": ""}), io.Discard)
	if err != nil || cfg.MetricsListen != "" {
		t.Errorf("IDEMGATE_METRICS_LISTEN=: metrics on %q, %v; want off", cfg.MetricsListen, err)
	}
	if cfg, err := dedupeapp.ParseConfig("dedupesvc", nil, cliflag.Map(nil), io.Discard); err != nil || cfg.MetricsListen != "127.0.0.1:9464" {
		t.Errorf("unset: metrics on %q, %v; want the default 127.0.0.1:9464", cfg.MetricsListen, err)
	}
	_, err = dedupeapp.ParseConfig("dedupesvc", nil, cliflag.Map(map[string]string{"IDEMGATE_SWEEP_INTERVAL": ""}), io.Discard)
	if want := `IDEMGATE_SWEEP_INTERVAL="" (-sweep-interval): `; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("IDEMGATE_SWEEP_INTERVAL=: %v, want an error starting %s", err, want)
	}
}

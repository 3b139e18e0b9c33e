package dedupeapp_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc/auth"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/protoset"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// -console-listen is off by default, served in plaintext on loopback
// only, and needs a way for an operator to sign in.
func TestConsoleListenIsCheckedAtParse(t *testing.T) {
	t.Parallel()
	cfg, err := dedupeapp.ParseConfig("dedupesvc", nil, cliflag.Map(nil), io.Discard)
	if err != nil || cfg.ConsoleListen != "" {
		t.Fatalf("default -console-listen %q, %v; want off", cfg.ConsoleListen, err)
	}
	cfg, err = dedupeapp.ParseConfig("dedupesvc", []string{"-token-file", "t"}, cliflag.Map(map[string]string{"IDEMGATE_CONSOLE_LISTEN": "127.0.0.1:8080"}), io.Discard)
	if err != nil || cfg.ConsoleListen != "127.0.0.1:8080" {
		t.Fatalf("IDEMGATE_CONSOLE_LISTEN: %q, %v", cfg.ConsoleListen, err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-console-listen", "0.0.0.0:8080", "-token-file", "t"}, "-console-listen 0.0.0.0:8080 is not a loopback address: serve the console over TLS"},
		// -insecure-plaintext lets the gRPC listener off loopback, not the console.
		{[]string{"-console-listen", "10.0.0.1:8080", "-token-file", "t", "-insecure-plaintext"}, "-insecure-plaintext does not apply"},
		{[]string{"-console-listen", "127.0.0.1:8080"}, "-console-listen needs a way for operators to sign in"},
		{[]string{"-console-listen", "127.0.0.1:9464", "-token-file", "t"}, "give the console an address of its own"},
		// Admin identities need client certificates, so client CAs.
		{[]string{"-console-listen", "127.0.0.1:8080", "-admin-identities", "spiffe://example.org/oncall"}, "-console-listen needs a way for operators to sign in"},
		// Descriptors are for the console: without it they would do nothing.
		{[]string{"-console-descriptors", "set.binpb"}, "-console-descriptors is for the console, which is off"},
	} {
		_, err := dedupeapp.ParseConfig("dedupesvc", tt.args, cliflag.Map(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseConfig(%q) = %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
	cfg, err = dedupeapp.ParseConfig("dedupesvc", []string{"-token-file", "t", "-console-listen", "127.0.0.1:8080"},
		cliflag.Map(map[string]string{"IDEMGATE_CONSOLE_DESCRIPTORS": "/etc/idemgate/tools.binpb"}), io.Discard)
	if err != nil || cfg.ConsoleDescriptors != "/etc/idemgate/tools.binpb" {
		t.Fatalf("IDEMGATE_CONSOLE_DESCRIPTORS: %q, %v", cfg.ConsoleDescriptors, err)
	}
	if _, err := dedupeapp.ParseConfig("dedupesvc", []string{"-console-listen", "10.0.0.1:8080", "-token-file", "t", "-tls-cert", "c", "-tls-key", "k"}, cliflag.Map(nil), io.Discard); err != nil {
		t.Errorf("console off loopback over TLS: %v", err)
	}
	if err := dedupeapp.CheckEmbeddable(dedupeapp.Config{ConsoleListen: "127.0.0.1:8080"}, func(f string) string { return "-" + f }); err == nil ||
		!strings.Contains(err.Error(), "-console-listen") {
		t.Errorf("CheckEmbeddable with a console: %v, want it refused", err)
	}
}

// consoleTokens writes a token file (harden_test.go's writeTokens).
func consoleTokens(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, text)
	return path
}

// Serve refuses to start a console off loopback without TLS (a Config built
// in Go skips ParseConfig's checks), one nobody could sign in to, or one
// whose -console-descriptors cannot be read or is not a descriptor set.
func TestServeRefusesAConsoleItCannotSecure(t *testing.T) {
	t.Parallel()
	clientsOnly := consoleTokens(t, "payments client payments-secret-0123456789\n")
	withAdmin := consoleTokens(t, "oncall admin oncall-secret-0123456789\n")
	dir := t.TempDir()
	notASet := filepath.Join(dir, "tools.binpb")
	if err := os.WriteFile(notASet, []byte("syntax = \"proto3\";\npackage shop.v1;\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.binpb")
	for _, tt := range []struct {
		name string
		cfg  dedupeapp.Config
		want string
	}{
		{"off loopback in plaintext", dedupeapp.Config{TokenFile: withAdmin, ConsoleListen: "0.0.0.0:0"}, "-console-listen 0.0.0.0:0 is not a loopback address"},
		{"no admin token", dedupeapp.Config{TokenFile: clientsOnly, ConsoleListen: "127.0.0.1:0"}, "-console-listen: nobody could sign in: -token-file " + clientsOnly + " has no token with the admin role"},
		{"no authentication", dedupeapp.Config{ConsoleListen: "127.0.0.1:0"}, "-console-listen needs authentication"},
		// A .proto source, not the set buf or protoc builds from it.
		{"descriptors not a set", dedupeapp.Config{TokenFile: withAdmin, ConsoleListen: "127.0.0.1:0", ConsoleDescriptors: notASet},
			"-console-descriptors " + notASet + " is not a FileDescriptorSet"},
		{"descriptors unreadable", dedupeapp.Config{TokenFile: withAdmin, ConsoleListen: "127.0.0.1:0", ConsoleDescriptors: missing},
			"-console-descriptors: open " + missing},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer lis.Close()
			cfg := tt.cfg
			cfg.DataDir = t.TempDir()
			cfg.Listen, cfg.SweepInterval, cfg.SweepBatch, cfg.ShutdownTimeout, cfg.PollInterval, cfg.UnknownRetention, cfg.MaxOutcomeBytes =
				lis.Addr().String(), time.Minute, 1, time.Second, 100*time.Millisecond, time.Hour, 1<<20
			err = dedupeapp.Serve(context.Background(), cfg, lis, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Serve: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// The service started with -console-listen serves the console over its
// own admin API: an admin signs in with the token file's token and sees the
// record a tool server made through the gRPC listener; a client-role token
// is refused.
func TestServeRunsTheConsole(t *testing.T) {
	t.Parallel()
	tokens := consoleTokens(t, "oncall admin oncall-secret-0123456789\npayments client payments-secret-0123456789\n")
	consoleAddr := stacktest.FreeAddr(t)
	addr := stacktest.ServeApp(t, dedupeapp.Config{DatabaseURL: pgtest.SchemaURL(t), MigrateOnStart: true, TokenFile: tokens, ConsoleListen: consoleAddr,
		CallerMaxRecords: 7})

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(auth.BearerToken("payments-secret-0123456789", true)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fp := sha256.Sum256([]byte("r"))
	if _, err := idemgatev1.NewDedupeServiceClient(conn).Begin(ctx, &idemgatev1.BeginRequest{Scope: "/shop.v1.Orders/Place|acme", Key: "order-77",
		Fingerprint: fp[:], AttemptToken: "a1", Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}

	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar}
	base := "http://" + consoleAddr
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := client.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	login := func(token string) (*http.Response, string) {
		t.Helper()
		_, page := get("/login")
		m := regexp.MustCompile(`name="login_csrf" value="([^"]+)"`).FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("no sign-in form:\n%s", page)
		}
		resp, err := client.PostForm(base+"/login", url.Values{"login_csrf": {m[1]}, "token": {token}})
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, page := login("payments-secret-0123456789"); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("client-role token: %s, want 403:\n%s", resp.Status, page)
	}
	resp, page := login("oncall-secret-0123456789")
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "/shop.v1.Orders/Place") || resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Fatalf("admin sign-in, then the overview: %s\n%s", resp.Status, page)
	}
	if !regexp.MustCompile(`id="store-health" class="ok">PostgreSQL [0-9.]+ .*at 127\.0\.0\.1:[0-9]+: answering \(the primary`).MatchString(page) {
		t.Fatalf("the overview does not show PostgreSQL answering as the primary:\n%s", page)
	}
	resp, page = get("/records?state=in_flight")
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "order-77") {
		t.Fatalf("in-flight records: %s\n%s", resp.Status, page)
	}
	// The Tenants page: the caller's usage against the configured quotas,
	// and the service's own refusal counters, after the caller fills its
	// records quota of 7 and has its 8th key refused.
	for i := range 7 {
		_, err := idemgatev1.NewDedupeServiceClient(conn).Begin(ctx, &idemgatev1.BeginRequest{Scope: "/shop.v1.Orders/Place|acme", Key: fmt.Sprint("order-", 78+i),
			Fingerprint: fp[:], AttemptToken: "a1", Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)})
		if want := codes.OK; i == 6 {
			want = codes.ResourceExhausted
			if status.Code(err) != want {
				t.Fatalf("Begin %d: %v, want %s", i+2, err, want)
			}
		} else if err != nil {
			t.Fatal(err)
		}
	}
	resp, page = get("/tenants")
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, `<tr class="alert"><td>payments</td><td>7</td><td>100.0%</td>`) ||
		!strings.Contains(page, "records 7 (-caller-max-records)") || !strings.Contains(page, `<tr><td>records</td><td class="alert">1</td></tr>`) {
		t.Fatalf("tenants: %s\n%s", resp.Status, page)
	}
	// The Activity page samples the service's registry (every 10s: before
	// the first interval it says when one comes).
	resp, page = get("/activity")
	if resp.StatusCode != http.StatusOK || strings.Contains(page, `id="activity-off"`) ||
		!strings.Contains(page, `id="activity-none"`) && !strings.Contains(page, `id="chart-calls"`) {
		t.Fatalf("activity: %s\n%s", resp.Status, page)
	}
}

// With -console-descriptors the console knows the tool servers' response
// types: the resolve page of an outcome-unknown record offers to complete
// it with the JSON of its method's response.
func TestServeGivesTheConsoleItsDescriptors(t *testing.T) {
	t.Parallel()
	set, err := protoset.Callers() // the example payments service, with its imports
	if err != nil {
		t.Fatal(err)
	}
	raw, err := proto.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	descriptors := filepath.Join(t.TempDir(), "payments.binpb")
	if err := os.WriteFile(descriptors, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := consoleTokens(t, "oncall admin oncall-secret-0123456789\npayments client payments-secret-0123456789\n")
	consoleAddr := stacktest.FreeAddr(t)
	addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokens, ConsoleListen: consoleAddr, ConsoleDescriptors: descriptors})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(auth.BearerToken("payments-secret-0123456789", true)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const scope = "/examples.payments.v1.PaymentsService/ChargeCard|acme"
	fp := sha256.Sum256([]byte("r"))
	dedupe := idemgatev1.NewDedupeServiceClient(conn)
	begun, err := dedupe.Begin(ctx, &idemgatev1.BeginRequest{Scope: scope, Key: "charge-1", Fingerprint: fp[:], AttemptToken: "a1",
		Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dedupe.Release(ctx, &idemgatev1.ReleaseRequest{Scope: scope, Key: "charge-1", AttemptToken: "a1", Epoch: begun.GetReserved().GetEpoch(), OutcomeUnknown: true}); err != nil {
		t.Fatal(err)
	}

	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar}
	base := "http://" + consoleAddr
	resp, err := client.Get(base + "/login")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`name="login_csrf" value="([^"]+)"`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no sign-in form:\n%s", b)
	}
	if resp, err = client.PostForm(base+"/login", url.Values{"login_csrf": {string(m[1])}, "token": {"oncall-secret-0123456789"}}); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = client.Get(base + "/resolve?" + url.Values{"ns": {"payments"}, "scope": {scope}, "key": {"charge-1"}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `id="complete-type">examples.payments.v1.ChargeCardResponse</code>`) {
		t.Fatalf("resolve page: %s, want the JSON form for examples.payments.v1.ChargeCardResponse:\n%s", resp.Status, b)
	}
}

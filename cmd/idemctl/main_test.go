package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"

	"github.com/idemgate/idemgate/dedupesvc/auth"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

const (
	adminToken    = "ops-admin-secret-0123456789"
	paymentsToken = "payments-secret-0123456789"
	scope         = "/examples.payments.v1.PaymentsService/ChargeCard"
)

// idemctl settles an unknown outcome end to end against a running service,
// on each store.
func TestResolveAnUnknownOutcomeEndToEnd(t *testing.T) {
	t.Parallel()
	for name, store := range map[string]dedupeapp.Config{
		"embedded": {DataDir: t.TempDir()},
		"postgres": {DatabaseURL: pgtest.SchemaURL(t), MigrateOnStart: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			addr := serve(t, store)
			payments := dedupeClient(t, addr, paymentsToken)
			ctx := context.Background()

			// A tool server reserved order-8842 and died mid-call.
			fp := sha256.Sum256([]byte("charge order-8842"))
			begin := func(token string) *idemgatev1.BeginResponse {
				res, err := payments.Begin(ctx, &idemgatev1.BeginRequest{Scope: scope, Key: "order-8842", Fingerprint: fp[:], AttemptToken: token,
					Lease: durationpb.New(time.Second), Retention: durationpb.New(time.Hour)})
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			begin("crashed")
			time.Sleep(1200 * time.Millisecond)
			if begin("retry").GetOutcomeUnknown() == nil {
				t.Fatal("the record is not outcome-unknown")
			}

			out := idemctl(t, 0, addr, adminToken, "list", "-state", "unknown")
			if !strings.Contains(out, "unknown") || !strings.Contains(out, "payments") || !strings.Contains(out, "order-8842") {
				t.Fatalf("list:\n%s", out)
			}
			// Paging: two more records in flight, listed a page at a time,
			// the unknown one first.
			for _, key := range []string{"order-1", "order-2"} {
				if _, err := payments.Begin(ctx, &idemgatev1.BeginRequest{Scope: scope, Key: key, Fingerprint: fp[:], AttemptToken: "t-" + key,
					Lease: durationpb.New(time.Hour), Retention: durationpb.New(time.Hour)}); err != nil {
					t.Fatal(err)
				}
			}
			first := idemctl(t, 0, addr, adminToken, "list", "-limit", "1")
			_, token, found := strings.Cut(first, "-page-token ")
			token, _, _ = strings.Cut(token, " ")
			if !strings.Contains(first, "order-8842") || strings.Contains(first, "order-1") || !found {
				t.Fatalf("list -limit 1:\n%s\nwant the unknown record and a page token", first)
			}
			if next := idemctl(t, 0, addr, adminToken, "list", "-limit", "1", "-page-token", token); !strings.Contains(next, "order-1") || strings.Contains(next, "order-8842") {
				t.Fatalf("list -limit 1 -page-token:\n%s\nwant the second record only", next)
			}
			if every := idemctl(t, 0, addr, adminToken, "list", "-limit", "1", "-all"); !strings.Contains(every, "order-8842") ||
				!strings.Contains(every, "order-1") || !strings.Contains(every, "order-2") || strings.Contains(every, "more records") {
				t.Fatalf("list -all:\n%s\nwant every record", every)
			}
			if out := idemctl(t, 1, addr, adminToken, "list", "-state", "in_flight", "-page-token", token); !strings.Contains(out, "InvalidArgument") || !strings.Contains(out, "pass the same state") {
				t.Fatalf("list with another listing's token:\n%s", out)
			}
			if out := idemctl(t, 1, addr, adminToken, "list", "-page-token", "garbage"); !strings.Contains(out, "InvalidArgument") || !strings.Contains(out, "page_token") {
				t.Fatalf("list with a bad token:\n%s", out)
			}
			if out := idemctl(t, 0, addr, adminToken, "count"); !hasRow(out, "unknown", scope, "1") || !hasRow(out, "in_flight", scope, "2") {
				t.Fatalf("count:\n%s", out)
			}
			if out := idemctl(t, 0, addr, adminToken, "migrations"); !strings.Contains(out, "applied") {
				t.Fatalf("migrations:\n%s", out)
			}
			// Only admins may.
			if out := idemctl(t, 1, addr, paymentsToken, "list"); !strings.Contains(out, "PermissionDenied") {
				t.Fatalf("list as a non-admin:\n%s", out)
			}
			if out := idemctl(t, 2, addr, adminToken, "resolve", "-scope", scope, "-key", "order-8842", "-namespace", "payments",
				"-complete-json", `{"chargeId": 42}`); !strings.Contains(out, "not a valid examples.payments.v1.ChargeCardResponse") {
				t.Fatalf("resolve with bad JSON:\n%s", out)
			}

			idemctl(t, 0, addr, adminToken, "resolve", "-scope", scope, "-key", "order-8842", "-namespace", "payments",
				"-complete-json", `{"chargeId": "ch_000042", "customerId": "cust_17", "amountCents": "4200"}`)
			replay := begin("after-resolve").GetCompleted()
			got := &paymentsv1.ChargeCardResponse{}
			if replay == nil || replay.GetOutcome().UnmarshalTo(got) != nil ||
				!proto.Equal(got, &paymentsv1.ChargeCardResponse{ChargeId: "ch_000042", CustomerId: "cust_17", AmountCents: 4200}) {
				t.Fatalf("after idemctl resolve: %v, want the resolved charge replayed", replay)
			}
			if out := idemctl(t, 0, addr, adminToken, "show", "-scope", scope, "-key", "order-8842", "-namespace", "payments"); !strings.Contains(out, "completed") {
				t.Fatalf("show:\n%s", out)
			}
		})
	}
}

// hasRow reports whether a table idemctl printed has a row of these cells.
func hasRow(table string, cells ...string) bool {
	for line := range strings.Lines(table) {
		if strings.Join(strings.Fields(line), " ") == strings.Join(cells, " ") {
			return true
		}
	}
	return false
}

// noEnv is an empty environment, so that the tests do not read the
// caller's IDEMCTL_* variables.
func noEnv(string) (string, bool) { return "", false }

func idemctl(t *testing.T, wantCode int, addr, token string, args ...string) string {
	t.Helper()
	return idemctlInput(t, "", wantCode, addr, token, args...)
}

// idemctlInput is idemctl with stdin, for the questions it asks.
func idemctlInput(t *testing.T, stdin string, wantCode int, addr, token string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"-addr", addr, "-token", token}, args...), noEnv, strings.NewReader(stdin), &stdout, &stderr)
	if code != wantCode {
		t.Fatalf("idemctl %v exited %d, want %d\nstdout:\n%s\nstderr:\n%s", args, code, wantCode, stdout.String(), stderr.String())
	}
	return stdout.String() + stderr.String()
}

func serve(t *testing.T, cfg dedupeapp.Config) string {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("ops admin "+adminToken+"\npayments client "+paymentsToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.TokenFile = tokens
	return stacktest.ServeApp(t, cfg)
}

func dedupeClient(t *testing.T, addr, token string) idemgatev1.DedupeServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(auth.BearerToken(token, true)), grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return idemgatev1.NewDedupeServiceClient(conn)
}

// Strings a tenant controls (the scope) come out escaped: an escape
// sequence cannot clear the operator's screen nor a newline forge a row.
func TestTenantStringsArePrintedEscaped(t *testing.T) {
	t.Parallel()
	// The service now refuses control characters in scopes, so the hostile
	// record is one an earlier version stored: written into the embedded
	// store directly, before the service opens it.
	dir := t.TempDir()
	const hostile = "/x.S/M\x1b[2J|\x1b[H\nunknown\tops\tforged"
	fp := sha256.Sum256([]byte("r"))
	store, err := sqlitestore.Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Begin(context.Background(), dedupesvc.BeginParams{Namespace: "payments", Scope: hostile, Key: "order-1",
		Fingerprint: fp[:], AttemptToken: "a", Lease: time.Hour, Retention: time.Hour, UnknownRetention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, dedupeapp.Config{DataDir: dir})
	for _, args := range [][]string{
		{"list"},
		{"count"},
		// show names the record itself, and the admin API now refuses a
		// scope with control characters (DEDUPE_REQUEST_INVALID).
	} {
		out := idemctl(t, 0, addr, adminToken, args...)
		if strings.ContainsAny(out, "\x1b") || strings.Contains(out, "\nunknown") {
			t.Errorf("idemctl %s printed the scope raw:\n%s", args[0], out)
		}
		if !strings.Contains(out, `\x1b[2J`) {
			t.Errorf("idemctl %s does not show the escaped scope:\n%s", args[0], out)
		}
	}
}

// The admin token never goes in plaintext to another machine unless the
// operator says so.
func TestPlaintextToARemoteAddressNeedsAFlag(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"10.0.0.1:50051", "dedupe.example:50051", "dns:///dedupe.example:50051"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"-addr", addr, "-token", adminToken, "list"}, noEnv, strings.NewReader(""), &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "-insecure-plaintext") {
			t.Errorf("plaintext to %s: exit %d, stderr %q; want 2 and a refusal naming -insecure-plaintext", addr, code, stderr.String())
		}
		// With the flag it dials (lazily: nothing is sent here).
		conn, err := dial(addr, adminToken, "", "", "", true)
		if err != nil {
			t.Errorf("-insecure-plaintext to %s: %v", addr, err)
			continue
		}
		_ = conn.Close()
	}
	for _, addr := range []string{"127.0.0.1:50051", "localhost:50051", "[::1]:50051"} {
		conn, err := dial(addr, adminToken, "", "", "", false)
		if err != nil {
			t.Errorf("plaintext to loopback %s: %v", addr, err)
			continue
		}
		_ = conn.Close()
	}
}

// The connection flags read their variables by cliflag's rule: a set one
// applies unless its flag is given, one that does not parse is an error
// naming it, its value and its flag (IDEMCTL_INSECURE_PLAINTEXT=maybe read
// as false before), and a variable does not count as a flag given: an
// IDEMCTL_TOKEN in the shell does not clash with -token-file.
func TestConnectionFlagsFollowTheOneRule(t *testing.T) {
	t.Parallel()
	envOf := cliflag.Map
	var stdout, stderr bytes.Buffer
	bad := map[string]string{"IDEMCTL_INSECURE_PLAINTEXT": "maybe", "IDEMCTL_TLS_CA": "", "IDEMCTL_ADDR": "10.0.0.1:50051"}
	code := run([]string{"-token", adminToken, "list"}, envOf(bad), strings.NewReader(""), &stdout, &stderr)
	if want := `IDEMCTL_INSECURE_PLAINTEXT="maybe" (-insecure-plaintext): `; code != 2 || !strings.Contains(stderr.String(), want) {
		t.Errorf("IDEMCTL_INSECURE_PLAINTEXT=maybe: exit %d, stderr %q; want 2 and %s", code, stderr.String(), want)
	}
	// The flag given, the bad variable is not read: idemctl dials
	// IDEMCTL_ADDR, where nothing listens.
	unused := stacktest.FreeAddr(t)
	bad["IDEMCTL_ADDR"] = unused
	stderr.Reset()
	code = run([]string{"-insecure-plaintext", "-token", adminToken, "count"}, envOf(bad), strings.NewReader(""), &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "cannot reach the Dedupe service at "+unused) {
		t.Errorf("-insecure-plaintext given: exit %d, stderr %q; want 1, IDEMCTL_ADDR %s unreachable", code, stderr.String(), unused)
	}

	addr := serve(t, dedupeapp.Config{DataDir: t.TempDir()})
	private := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(private, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"IDEMCTL_ADDR and IDEMCTL_TOKEN", nil, map[string]string{"IDEMCTL_ADDR": addr, "IDEMCTL_TOKEN": adminToken}},
		{"IDEMCTL_TOKEN_FILE", []string{"-addr", addr}, map[string]string{"IDEMCTL_TOKEN_FILE": private}},
		{"-token-file with IDEMCTL_TOKEN set", []string{"-addr", addr, "-token-file", private}, map[string]string{"IDEMCTL_TOKEN": "not-the-token"}},
	} {
		stderr.Reset()
		if code := run(append(tc.args, "count"), envOf(tc.env), strings.NewReader(""), &stdout, &stderr); code != 0 {
			t.Errorf("%s: exit %d, stderr %q; want 0", tc.name, code, stderr.String())
		}
	}
	stderr.Reset()
	if code := run([]string{"-h"}, noEnv, strings.NewReader(""), &stdout, &stderr); code != 0 && code != 2 {
		t.Fatalf("-h: exit %d", code)
	}
	for _, want := range []string{"(env IDEMCTL_ADDR)", "(env IDEMCTL_TOKEN)", "(env IDEMCTL_TOKEN_FILE)", "(env IDEMCTL_INSECURE_PLAINTEXT)", "(env IDEMCTL_TLS_CA)"} {
		if strings.Count(stderr.String(), want) != 1 {
			t.Errorf("usage:\n%s\nwant %s once", stderr.String(), want)
		}
	}
}

// `-token $ADMIN list` with ADMIN empty or unset hands "list" to -token; the
// command must not run with the command name as its token, and the message
// must say what happened and what to do.
func TestAnEmptyTokenVariableDoesNotSwallowTheCommand(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-token", "list"},
		{"-token", "show", "-scope", scope, "-key", "order-1"},
		{"-addr", "127.0.0.1:1", "--token", "forget", "-key", "k"},
		{"-addr", "127.0.0.1:1", "-token", "forget"},
		{"-insecure-plaintext", "-addr", "127.0.0.1:1", "-token", "count"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(args, noEnv, strings.NewReader(""), &stdout, &stderr)
		swallowed := args[slices.IndexFunc(args, func(a string) bool { return strings.TrimLeft(a, "-") == "token" })+1]
		// The phrase only this check prints, naming the swallowed command:
		// the general usage text mentions IDEMCTL_TOKEN and -token-file too.
		want := fmt.Sprintf("-token took %q, a command, as the token", swallowed)
		if msg := stderr.String(); code != 2 || !strings.Contains(msg, want) || !strings.Contains(msg, "IDEMCTL_TOKEN") ||
			!strings.Contains(msg, "-token-file") || strings.Contains(msg, "usage:") {
			t.Errorf("idemctl %v: exit %d, stderr %q; want 2 and %q with IDEMCTL_TOKEN and -token-file, not the usage", args, code, msg, want)
		}
	}
}

// The token can come from a file, which must be private like the service's.
func TestTokenFile(t *testing.T) {
	t.Parallel()
	addr := serve(t, dedupeapp.Config{DataDir: t.TempDir()})
	dir := t.TempDir()
	private, open := filepath.Join(dir, "private"), filepath.Join(dir, "open")
	if err := os.WriteFile(private, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(open, []byte(adminToken+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-addr", addr, "-token-file", private, "count"}, noEnv, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("-token-file: exit %d, %s", code, stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"-addr", addr, "-token-file", open, "count"}, noEnv, strings.NewReader(""), &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "chmod 600") {
		t.Fatalf("a token file others may read: exit %d, %q; want 2 and chmod 600", code, stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"-addr", addr, "-token", adminToken, "-token-file", private, "count"}, noEnv, strings.NewReader(""), &stdout, &stderr); code != 2 {
		t.Fatalf("-token and -token-file: exit %d, %q; want 2", code, stderr.String())
	}
}

// A service that cannot be reached is reported with its address, what
// failed and what to do, not as "Unavailable :".
func TestConnectionErrorsAreReadable(t *testing.T) {
	t.Parallel()
	addr := stacktest.FreeAddr(t) // nothing listens there
	var stdout, stderr bytes.Buffer
	code := run([]string{"-addr", addr, "-token", adminToken, "count"}, noEnv, strings.NewReader(""), &stdout, &stderr)
	msg := stderr.String()
	if code != 1 || strings.Contains(msg, "Unavailable :") || !strings.Contains(msg, addr) || !strings.Contains(msg, "cannot reach") ||
		!strings.Contains(msg, "connection refused") || !strings.Contains(msg, "-addr") {
		t.Fatalf("exit %d, stderr %q; want 1 and a message naming %s, the refused connection and -addr", code, msg, addr)
	}
}

// show prints the stored outcome (a response as JSON, a stored error, an
// unknown type raw), the replay count and ages; list sorts by replays;
// forget asks for the key and forgets, refusing an in-flight record unless
// forced; on each store, against a running service.
func TestShowListAndForgetEndToEnd(t *testing.T) {
	t.Parallel()
	for name, store := range map[string]dedupeapp.Config{
		"embedded": {DataDir: t.TempDir(), ReplayFlushInterval: 20 * time.Millisecond},
		"postgres": {DatabaseURL: pgtest.SchemaURL(t), MigrateOnStart: true, ReplayFlushInterval: 20 * time.Millisecond},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			addr := serve(t, store)
			payments := dedupeClient(t, addr, paymentsToken)
			ctx := context.Background()
			fp := sha256.Sum256([]byte("charge"))
			begin := func(key, token string) *idemgatev1.BeginResponse {
				t.Helper()
				res, err := payments.Begin(ctx, &idemgatev1.BeginRequest{Scope: scope, Key: key, Fingerprint: fp[:], AttemptToken: token,
					Lease: durationpb.New(time.Hour), Retention: durationpb.New(time.Hour)})
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			complete := func(key string, outcome *anypb.Any) {
				t.Helper()
				r := begin(key, "t-"+key).GetReserved()
				if _, err := payments.Finish(ctx, &idemgatev1.FinishRequest{Scope: scope, Key: key, AttemptToken: "t-" + key, Epoch: r.GetEpoch(), Outcome: outcome}); err != nil {
					t.Fatal(err)
				}
			}
			charge, _ := anypb.New(&paymentsv1.ChargeCardResponse{ChargeId: "ch_000042", CustomerId: "cust_17", AmountCents: 4200})
			complete("order-1", charge)
			info, _ := anypb.New(&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.example"})
			declined, _ := anypb.New(&spb.Status{Code: int32(codes.InvalidArgument), Message: "card declined", Details: []*anypb.Any{info}})
			complete("order-2", declined)
			complete("order-3", &anypb.Any{TypeUrl: "type.googleapis.com/acme.v9.Secret", Value: []byte{1, 2, 3}})
			for i := range 3 {
				if begin("order-1", fmt.Sprint("dup-", i)).GetCompleted() == nil {
					t.Fatal("order-1 is not replayed")
				}
			}
			begin("order-2", "dup")

			show := func(key string) string {
				return idemctl(t, 0, addr, adminToken, "show", "-namespace", "payments", "-scope", scope, "-key", key)
			}
			replays := func(out string) string {
				for line := range strings.Lines(out) {
					if f := strings.Fields(line); len(f) > 1 && f[0] == "replays" {
						return f[1]
					}
				}
				return ""
			}
			// The service flushes its counts every 20ms; a starved machine
			// may take far longer, so wait for the count, not for a time.
			out := show("order-1")
			for deadline := time.Now().Add(time.Minute); replays(out) != "3" || replays(show("order-2")) != "1"; out = show("order-1") {
				if time.Now().After(deadline) {
					t.Fatalf("the replays never reached the record:\n%s", out)
				}
				time.Sleep(20 * time.Millisecond)
			}
			for _, want := range []string{"examples.payments.v1.ChargeCardResponse", `"chargeId": "ch_000042"`, `"amountCents": "4200"`, "after completion", "ago"} {
				if !strings.Contains(out, want) {
					t.Errorf("show order-1 does not print %q:\n%s", want, out)
				}
			}
			out = show("order-2")
			for _, want := range []string{"a stored error", "code: InvalidArgument", "message: card declined", `"reason": "CARD_DECLINED"`} {
				if !strings.Contains(out, want) {
					t.Errorf("show order-2 does not print %q:\n%s", want, out)
				}
			}
			out = show("order-3")
			if !strings.Contains(out, "type.googleapis.com/acme.v9.Secret") || !strings.Contains(out, "AQID") || !strings.Contains(out, "-descriptors") {
				t.Errorf("show of an unknown type: want its type URL, base64 and a hint at -descriptors:\n%s", out)
			}

			byReplays := idemctl(t, 0, addr, adminToken, "list", "-sort", "replays")
			lines := strings.Split(strings.TrimSpace(byReplays), "\n")
			if len(lines) != 3 || !strings.Contains(lines[1], "order-1") || strings.Fields(lines[1])[0] != "3" ||
				!strings.Contains(lines[2], "order-2") || strings.Contains(byReplays, "order-3") {
				t.Fatalf("list -sort replays:\n%s\nwant order-1 (3) then order-2 (1), nothing never replayed", byReplays)
			}
			if byAge := idemctl(t, 0, addr, adminToken, "list", "-sort", "replay-age"); !strings.Contains(byAge, "order-1") || !strings.Contains(byAge, "order-2") || strings.Contains(byAge, "order-3") {
				t.Fatalf("list -sort replay-age:\n%s", byAge)
			}
			// Paging keeps the order: a page token of one order does not
			// resume a listing in another.
			first := idemctl(t, 0, addr, adminToken, "list", "-sort", "replays", "-limit", "1")
			_, pageToken, found := strings.Cut(first, "-page-token ")
			pageToken, _, _ = strings.Cut(pageToken, " ")
			if !found || !strings.Contains(first, "order-1") || strings.Contains(first, "order-2") {
				t.Fatalf("list -sort replays -limit 1:\n%s", first)
			}
			if next := idemctl(t, 0, addr, adminToken, "list", "-sort", "replays", "-limit", "1", "-page-token", pageToken); !strings.Contains(next, "order-2") || strings.Contains(next, "order-1") {
				t.Fatalf("the second page by replays:\n%s", next)
			}
			if out := idemctl(t, 1, addr, adminToken, "list", "-page-token", pageToken); !strings.Contains(out, "same order") {
				t.Fatalf("a replay listing's page token in the default order:\n%s", out)
			}
			if out := idemctl(t, 2, addr, adminToken, "list", "-sort", "newest"); !strings.Contains(out, "replay-age") {
				t.Fatalf("list -sort newest:\n%s", out)
			}

			forget := []string{"forget", "-namespace", "payments", "-scope", scope, "-key", "order-1"}
			if out := idemctlInput(t, "order-2\n", 1, addr, adminToken, forget...); !strings.Contains(out, "AGAIN") || !strings.Contains(out, "not forgotten") {
				t.Fatalf("forget answered with another key:\n%s", out)
			}
			if begin("order-1", "dup-after-refusal").GetCompleted() == nil {
				t.Fatal("a forget not confirmed forgot the record")
			}
			if out := idemctlInput(t, "order-1\n", 0, addr, adminToken, forget...); !strings.Contains(out, "forgot") || !strings.Contains(out, "was completed") {
				t.Fatalf("forget:\n%s", out)
			}
			rerun := begin("order-1", "t-rerun").GetReserved()
			if rerun == nil || rerun.GetEpoch() <= 1 {
				t.Fatalf("after forget, order-1: %v; want reserved anew with a higher epoch", rerun)
			}
			// Now in flight: refused without -force, whatever the answer.
			if out := idemctlInput(t, "order-1\n", 1, addr, adminToken, forget...); !strings.Contains(out, "-force") || !strings.Contains(out, "NOW") {
				t.Fatalf("forget in flight without -force:\n%s", out)
			}
			if out := idemctl(t, 0, addr, adminToken, append(forget, "-force", "-yes")...); !strings.Contains(out, "was in_flight") {
				t.Fatalf("forget -force -yes:\n%s", out)
			}
			if begin("order-1", "t-after-force").GetReserved() == nil {
				t.Fatal("after a forced forget the key is not free")
			}
			if out := idemctl(t, 1, addr, adminToken, "forget", "-namespace", "payments", "-scope", scope, "-key", "never-seen", "-yes"); !strings.Contains(out, "RECORD_NOT_FOUND") {
				t.Fatalf("forget of no record:\n%s", out)
			}
		})
	}
}

// show reads -descriptors before it calls the service: a bad file is
// reported as such, not hidden behind a connection error.
func TestShowReportsABadDescriptorFileBeforeCallingTheService(t *testing.T) {
	t.Parallel()
	addr := stacktest.FreeAddr(t) // nothing listens there
	missing := filepath.Join(t.TempDir(), "missing.binpb")
	var stdout, stderr bytes.Buffer
	code := run([]string{"-addr", addr, "-token", adminToken, "show", "-scope", scope, "-key", "k", "-descriptors", missing}, noEnv, strings.NewReader(""), &stdout, &stderr)
	if msg := stderr.String(); code != 2 || !strings.Contains(msg, "missing.binpb") || strings.Contains(msg, "cannot reach") {
		t.Fatalf("exit %d, stderr %q; want 2 and the descriptor file's error, before any call", code, msg)
	}
}

// An error leaves stdout empty: no table header before it, nothing a script
// piping list into another command could take for records. A show of a
// record that does not exist says so, naming its scope and key, rather than
// printing an empty record.
func TestErrorsPrintNothingOnStdout(t *testing.T) {
	t.Parallel()
	for name, store := range map[string]dedupeapp.Config{
		"embedded": {DataDir: t.TempDir()},
		"postgres": {DatabaseURL: pgtest.SchemaURL(t), MigrateOnStart: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			addr := serve(t, store)
			unreachable := stacktest.FreeAddr(t) // nothing listens there
			for _, c := range []struct {
				name, addr, token string
				args              []string
				// stderr must hold every one of these.
				stderr []string
			}{
				{"list, service unreachable", unreachable, adminToken, []string{"list"}, []string{"cannot reach", unreachable}},
				{"list -sort replays, service unreachable", unreachable, adminToken, []string{"list", "-sort", "replays"}, []string{"cannot reach"}},
				{"list, refused", addr, paymentsToken, []string{"list"}, []string{"PermissionDenied"}},
				{"count, refused", addr, paymentsToken, []string{"count"}, []string{"PermissionDenied"}},
				{"show, no such record", addr, adminToken, []string{"show", "-namespace", "payments", "-scope", scope, "-key", "order-404"},
					[]string{"does not exist", scope, "order-404", "payments"}},
				{"show, no such record, no namespace", addr, adminToken, []string{"show", "-scope", scope, "-key", "order-404"},
					[]string{"does not exist", scope, "order-404"}},
			} {
				var stdout, stderr bytes.Buffer
				code := run(append([]string{"-addr", c.addr, "-token", c.token}, c.args...), noEnv, strings.NewReader(""), &stdout, &stderr)
				if code == 0 || stdout.Len() > 0 {
					t.Errorf("%s: exit %d, stdout %q; want non-zero and nothing", c.name, code, stdout.String())
				}
				for _, want := range c.stderr {
					if !strings.Contains(stderr.String(), want) {
						t.Errorf("%s: stderr %q; want it to hold %q", c.name, stderr.String(), want)
					}
				}
			}
			// A record with no outcome yet says so, not " (0 bytes)".
			fp := sha256.Sum256([]byte("charge"))
			if _, err := dedupeClient(t, addr, paymentsToken).Begin(context.Background(), &idemgatev1.BeginRequest{Scope: scope, Key: "order-5",
				Fingerprint: fp[:], AttemptToken: "t", Lease: durationpb.New(time.Hour), Retention: durationpb.New(time.Hour)}); err != nil {
				t.Fatal(err)
			}
			if out := idemctl(t, 0, addr, adminToken, "show", "-namespace", "payments", "-scope", scope, "-key", "order-5"); !hasRow(out, "outcome_type", "- (no outcome stored)") ||
				strings.Contains(out, "(0 bytes)") {
				t.Errorf("show of an in-flight record:\n%s\nwant outcome_type - (no outcome stored)", out)
			}
		})
	}
}

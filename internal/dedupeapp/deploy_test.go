package dedupeapp_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/certtest"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// The service as deployments run it (docs/operating.md): behind a PgBouncer
// in transaction pooling mode, as a runtime role that may not change the
// schema, which its owner migrated.

// sharedDatabase is the database of the shared test server.
func sharedDatabase(t *testing.T) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

// serveErrOn runs Serve with cfg and returns its error, for a configuration
// refused at start; one that starts instead is stopped after a minute (a
// bound on the test, not a timing assertion) and answers nil.
func serveErrOn(t *testing.T, cfg dedupeapp.Config) error {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return dedupeapp.Serve(ctx, cfg, lis, slog.New(slog.DiscardHandler))
}

// TestGateThroughPgBouncerAsRuntimeRole: a gated payments server on the
// Dedupe service behind PgBouncer, as the runtime role, with the settings
// docs/operating.md gives (default_query_exec_mode=exec, the listener on
// -listen-database-url, the default -migrate-on-start). Concurrent
// duplicates of one charge: one execution, every answer the same bytes.
func TestGateThroughPgBouncerAsRuntimeRole(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.NewBouncer(t)
	roles := pgtest.NewRoles(t)
	cfg := dedupeapp.Config{
		DatabaseURL:       bouncer.URL(roles.Runtime, sharedDatabase(t), url.Values{"default_query_exec_mode": {"exec"}}),
		ListenDatabaseURL: roles.RuntimeURL(t),
		MigrateOnStart:    true,
		Notify:            true,
		MaxConns:          8, // twice the bouncer's server connections
	}
	dedupeConn := dial(t, stacktest.ServeApp(t, cfg))
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(dedupeConn), interceptor.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ledger := &payments.Ledger{}
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
	paymentsv1.RegisterPaymentsServiceServer(srv, &payments.Server{Ledger: ledger, Provider: func(ctx context.Context) error {
		once.Do(func() { close(started) })
		select { // holds the first execution while its duplicates arrive and wait
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
	client := paymentsv1.NewPaymentsServiceClient(stacktest.Serve(t, srv))

	const callers = 8
	keyed := metadata.AppendToOutgoingContext(callCtx(t), idemgate.KeyHeader, "pgbouncer-charge-1")
	req := &paymentsv1.ChargeCardRequest{CustomerId: "cust_pgbouncer", AmountCents: 1234}
	answers := make([][]byte, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			resp, err := client.ChargeCard(keyed, req, grpc.WaitForReady(true))
			if err == nil {
				answers[i], err = proto.MarshalOptions{Deterministic: true}.Marshal(resp)
			}
			errs[i] = err
		})
	}
	<-started
	close(release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("caller %d: %v", i, err)
		}
		if string(answers[i]) != string(answers[0]) {
			t.Fatalf("caller %d got another answer than caller 0: %x vs %x", i, answers[i], answers[0])
		}
	}
	if charges, _ := ledger.Executions("cust_pgbouncer"); charges != 1 {
		t.Fatalf("%d charges for one key through PgBouncer, want 1", charges)
	}
	// After they all answered: one more duplicate replays the stored outcome.
	resp, err := client.ChargeCard(keyed, req)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := (proto.MarshalOptions{Deterministic: true}).Marshal(resp); string(b) != string(answers[0]) {
		t.Fatalf("the replay differs from the first answer: %x vs %x", b, answers[0])
	}
}

// TestServeRefusesAPoolerWithTheStatementCache: through a pooler, pgx's
// default statement cache fails as soon as two clients share a server
// connection (prepared statement "stmtcache_..." already exists / does not
// exist); the service refuses to start, saying which URL parameter to add.
// With it, it refuses to LISTEN through the pooler, saying to set
// -listen-database-url or -notify=false; with -notify=false it starts.
func TestServeRefusesAPoolerWithTheStatementCache(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.NewBouncer(t)
	roles := pgtest.NewRoles(t)
	err := serveErrOn(t, dedupeapp.Config{DatabaseURL: bouncer.URL(roles.Runtime, sharedDatabase(t), nil), MigrateOnStart: true, Notify: true})
	if err == nil || !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
		t.Fatalf("Serve through PgBouncer with pgx's statement cache: %v; want a refusal naming default_query_exec_mode=exec", err)
	}
	// With the query mode, the listener must not LISTEN through the pooler.
	execMode := bouncer.URL(roles.Runtime, sharedDatabase(t), url.Values{"default_query_exec_mode": {"exec"}})
	err = serveErrOn(t, dedupeapp.Config{DatabaseURL: execMode, MigrateOnStart: true, Notify: true})
	if err == nil || !strings.Contains(err.Error(), "-listen-database-url") || !strings.Contains(err.Error(), "-notify=false") {
		t.Fatalf("Serve through PgBouncer with the listener on it too: %v; want a refusal naming -listen-database-url and -notify=false", err)
	}
	// Without notifications it starts: waiters poll.
	addr, stop := stacktest.StartApp(t, dedupeapp.Config{DatabaseURL: execMode, MigrateOnStart: true, Notify: false})
	if _, err := healthpb.NewHealthClient(dial(t, addr)).Check(callCtx(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Serve through PgBouncer with -notify=false: health check: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Serve through PgBouncer with -notify=false: %v", err)
	}
	// The same server directly: no pooler, no refusal (the URL says nothing).
	addr, stop = stacktest.StartApp(t, dedupeapp.Config{DatabaseURL: roles.RuntimeURL(t), MigrateOnStart: true, Notify: true})
	if _, err := healthpb.NewHealthClient(dial(t, addr)).Check(callCtx(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Serve directly as the runtime role: health check: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Serve directly as the runtime role: %v", err)
	}
}

// TestServeRefusesASchemaMissingMigrations: a runtime role never changes
// the schema; a schema that lacks a migration is refused at start, saying
// to migrate as the owner, whether -migrate-on-start is on or off.
func TestServeRefusesASchemaMissingMigrations(t *testing.T) {
	t.Parallel()
	roles := pgtest.NewRoles(t)
	owner := roles.DirectPool(t, roles.Owner, roles.Schema)
	all, _ := pgstore.Migrations()
	last := all[len(all)-1]
	if _, err := owner.Exec(context.Background(), "DELETE FROM idemgate_schema_migrations WHERE version = $1", last.Version); err != nil {
		t.Fatal(err)
	}
	for _, migrateOnStart := range []bool{true, false} {
		err := serveErrOn(t, dedupeapp.Config{DatabaseURL: roles.RuntimeURL(t), MigrateOnStart: migrateOnStart, Notify: true})
		if err == nil || !strings.Contains(err.Error(), "dedupesvc migrate") || !strings.Contains(err.Error(), "owner") || !strings.Contains(err.Error(), last.Name) {
			t.Errorf("Serve as the runtime role (-migrate-on-start=%v) on a schema missing %s: %v; want a refusal saying to run dedupesvc migrate as the owner", migrateOnStart, last.Name, err)
		}
	}
}

// TestServeWithVerifyFull: the service on a PostgreSQL that serves TLS, its
// URL saying sslmode=verify-full with the server's CA (sslrootcert): it
// starts, migrates and answers over TLS; given another CA, it refuses to
// start with the certificate error.
func TestServeWithVerifyFull(t *testing.T) {
	t.Parallel()
	cluster := pgtest.NewCluster(t)
	ca := certtest.NewCA(t, "db-ca")
	server := ca.Server(t, "localhost", time.Hour)
	cluster.EnableTLS(t, server.CertPEM, server.KeyPEM)
	dir := t.TempDir()
	caFile, otherCAFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "other-ca.pem")
	certtest.Write(t, caFile, ca.PEM)
	certtest.Write(t, otherCAFile, certtest.NewCA(t, "other-ca").PEM)
	verifyFull := func(rootCert string) string {
		return fmt.Sprintf("postgres://postgres@localhost:%d/postgres?sslmode=verify-full&sslrootcert=%s", cluster.Port(), url.QueryEscape(rootCert))
	}
	// The reload that turns ssl on takes effect asynchronously.
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := pgx.Connect(context.Background(), verifyFull(caFile))
		if err == nil {
			_ = conn.Close(context.Background())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no verify-full connection within a minute: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	addr, stop := stacktest.StartApp(t, dedupeapp.Config{DatabaseURL: verifyFull(caFile), MigrateOnStart: true, Notify: true})
	if _, err := healthpb.NewHealthClient(dial(t, addr)).Check(callCtx(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Serve with sslmode=verify-full: health check: %v", err)
	}
	admin, err := pgx.Connect(context.Background(), cluster.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	var tlsConns int
	if err := admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_ssl WHERE ssl").Scan(&tlsConns); err != nil || tlsConns == 0 {
		t.Fatalf("connections over TLS while the service runs: %d (%v), want its pool's", tlsConns, err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Serve with sslmode=verify-full: %v", err)
	}
	if err := serveErrOn(t, dedupeapp.Config{DatabaseURL: verifyFull(otherCAFile), MigrateOnStart: true, Notify: true}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Serve with verify-full and another CA: %v; want a refusal naming the certificate", err)
	}
}

package dedupeapp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/tap"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/httplimits"
	"github.com/idemgate/idemgate/internal/tlsfiles"
)

// OpenPool connects to cfg.DatabaseURL with the configured pool size
// (DefaultDBMaxConns when cfg.MaxConns is 0) and checks the connection.
func OpenPool(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("%s: not a PostgreSQL URL: %w", cfg.name("database-url"), err)
	}
	pcfg.MaxConns = DefaultDBMaxConns
	if cfg.MaxConns > 0 {
		pcfg.MaxConns = int32(cfg.MaxConns)
	}
	// Also the NOTIFY listener's, which connects like the pool.
	pcfg.ConnConfig.DialFunc = pgstore.RejectSelfConnects(pcfg.ConnConfig.DialFunc)
	pgstore.KeepConnsOnCancel(&pcfg.ConnConfig.Config)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("%s: open database pool: %w", cfg.nameEnv("database-url", "DATABASE_URL"), err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%s: connect to %s@%s:%d/%s: %w", cfg.nameEnv("database-url", "DATABASE_URL"), pcfg.ConnConfig.User, pcfg.ConnConfig.Host, pcfg.ConnConfig.Port, pcfg.ConnConfig.Database, err)
	}
	return pool, nil
}

// OpenEmbedded opens the embedded store in dir (sqlitestore.Open); its
// errors start with the flag that chooses dir.
func OpenEmbedded(ctx context.Context, dir string, opts ...sqlitestore.Option) (*sqlitestore.Store, error) {
	s, err := sqlitestore.Open(ctx, dir, opts...)
	if err != nil {
		return nil, fmt.Errorf("-data-dir %s: %w", dir, err)
	}
	return s, nil
}

// Input bounds of the gRPC server.
const (
	maxHeaderBytes = 16 << 10
	envelopeBytes  = 64 << 10
)

// backend is the store the service runs on, opened by Open.
type backend struct {
	store    dedupesvc.Store
	notifier dedupesvc.Notifier
	// run, when set, runs until its context ends (the NOTIFY listener).
	run   func(context.Context)
	close func()
	// pool is the PostgreSQL connection pool, nil on the embedded store.
	pool *pgxpool.Pool
}

// openBackend opens the store cfg selects: PostgreSQL when a database URL is
// set, else the embedded SQLite store. Its first log line says which and
// where, before anything can fail.
func openBackend(ctx context.Context, cfg Config, logger *slog.Logger) (backend, error) {
	if cfg.DatabaseURL == "" {
		logger.Info("using the embedded store (SQLite); set "+cfg.nameEnv("database-url", "DATABASE_URL")+" to use PostgreSQL",
			slog.String("store", "sqlite"), slog.String("path", filepath.Join(cfg.DataDir, sqlitestore.FileName)))
		gc := sqlitestore.DefaultGroupCommit
		if cfg.StoreMaxBatch > 0 {
			gc.MaxBatch = cfg.StoreMaxBatch
		}
		s, err := sqlitestore.Open(ctx, cfg.DataDir, sqlitestore.WithGroupCommit(gc))
		if err != nil {
			return backend{}, fmt.Errorf("%s %s: %w", cfg.name("data-dir"), cfg.DataDir, err)
		}
		// The store's files are 0600 whatever the umask; a directory others
		// may list still shows them keys' existence and sizes, and may hold
		// other files: say so.
		if fi, err := os.Stat(cfg.DataDir); err == nil && runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
			logger.Warn(fmt.Sprintf("the data directory is open to group or others (mode %#o); the store's files are 0600, restrict the directory too: chmod 700 %s", fi.Mode().Perm(), cfg.DataDir),
				slog.String("path", cfg.DataDir))
		}
		return backend{store: s, notifier: s, close: func() { _ = s.Close() }}, nil
	}
	logger.Info("using PostgreSQL", slog.String("store", "postgres"), slog.String("database", redactedURL(cfg.DatabaseURL)))
	pool, err := OpenPool(ctx, cfg)
	if err != nil {
		return backend{}, err
	}
	if err := checkPooler(ctx, pool, cfg, logger); err != nil {
		pool.Close()
		return backend{}, err
	}
	if cfg.MigrateOnStart {
		// Current, it runs no DDL: a runtime role may start with it on.
		applied, err := pgstore.Migrate(ctx, pool)
		if err != nil {
			pool.Close()
			return backend{}, fmt.Errorf("migrate (%s): %w", cfg.name("migrate-on-start"), err)
		}
		logger.Info("migrations applied", slog.Any("applied", applied))
	} else {
		pending, err := pgstore.Pending(ctx, pool)
		if err == nil && len(pending) > 0 {
			err = fmt.Errorf("the schema lacks migrations %s: run `dedupesvc migrate` as the schema's owner (or serve with -migrate-on-start=true as a role that may change the schema)", strings.Join(pending, ", "))
		}
		if err != nil {
			pool.Close()
			return backend{}, err
		}
	}
	b := backend{close: pool.Close, pool: pool}
	// Half the pool writes batches at most, so the other half stays free for
	// the statements that are not batched (reads, takeovers, heartbeats).
	gc := pgstore.DefaultGroupCommit
	if cfg.StoreWriters > 0 {
		gc.Writers = cfg.StoreWriters
	}
	gc.Writers = max(1, min(gc.Writers, int(pool.Config().MaxConns)/2))
	if cfg.StoreMaxBatch > 0 {
		gc.MaxBatch = cfg.StoreMaxBatch
	}
	storeOpts := []pgstore.Option{pgstore.WithGroupCommit(gc)}
	// On a Citus coordinator whose schema is distributed (migration 013),
	// the store runs the statements' Citus forms.
	citus, err := pgstore.DetectCitus(ctx, pool)
	if err != nil {
		pool.Close()
		return backend{}, err
	}
	if citus {
		logger.Info("the database is a Citus coordinator: the store runs its Citus forms")
		storeOpts = append(storeOpts, pgstore.WithCitus())
	}
	if cfg.Notify {
		b.store = pgstore.New(pool, storeOpts...)
		var listenOpts []pgstore.ListenerOption
		if cfg.ListenDatabaseURL != "" {
			listenConfig, err := pgx.ParseConfig(cfg.ListenDatabaseURL)
			if err != nil {
				pool.Close()
				return backend{}, fmt.Errorf("-listen-database-url: not a PostgreSQL URL: %w", err)
			}
			listenConfig.DialFunc = pgstore.RejectSelfConnects(listenConfig.DialFunc)
			listenOpts = append(listenOpts, pgstore.ListenOn(listenConfig))
		}
		listener := pgstore.NewListener(pool, pgstore.DefaultChannel, logger, listenOpts...)
		b.notifier, b.run = listener, listener.Run
	} else {
		b.store = pgstore.New(pool, append(storeOpts, pgstore.WithoutNotify())...)
	}
	// This process has been away (it is starting, maybe after a crash), so
	// holders that renew through it may not have been able to: every
	// in-flight lease gets one more full lease from now. The embedded store
	// does the same when it opens.
	if err := b.store.(dedupesvc.Resumer).MarkResumed(ctx); err != nil {
		pool.Close()
		return backend{}, fmt.Errorf("mark the store resumed: %w; is the schema migrated? run dedupesvc migrate, or serve with -migrate-on-start=true", err)
	}
	warmPool(ctx, pool, logger)
	return b, nil
}

// checkPooler refuses a pool that reaches PostgreSQL through a connection
// pooler (PgBouncer) with pgx's default statement cache: under transaction
// pooling its named prepared statements land on server connections other
// clients then use, and statements fail with "prepared statement
// stmtcache_... already exists" or "does not exist". A URL that chooses its
// default_query_exec_mode is trusted: exec (or cache_describe) for
// transaction pooling, cache_statement for session pooling. It also refuses
// a NOTIFY listener that would connect through the pooler: under
// transaction pooling its LISTEN stays on a server connection other
// clients then use, its notifications reach them (pgx keeps them in each
// connection's memory) and never the listener; -listen-database-url says
// where it may listen. A pooler shows itself by announcing a process id at
// connection (its own cancel key) other than the server's
// pg_backend_pid().
func checkPooler(ctx context.Context, pool *pgxpool.Pool, cfg Config, logger *slog.Logger) error {
	databaseURL := cfg.DatabaseURL
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("-database-url (DATABASE_URL): %w", err)
	}
	defer conn.Release()
	var backendPID uint32
	// The simple protocol prepares nothing, so the check itself works
	// through any pooler.
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&backendPID); err != nil {
		return fmt.Errorf("-database-url (DATABASE_URL): %w", err)
	}
	if backendPID == conn.Conn().PgConn().PID() {
		return nil
	}
	mode := pool.Config().ConnConfig.DefaultQueryExecMode
	if urlSetsExecMode(databaseURL) {
		if cfg.Notify && cfg.ListenDatabaseURL == "" {
			return errors.New("-database-url (DATABASE_URL): a connection pooler (PgBouncer?) is between the service and PostgreSQL, and the NOTIFY listener " +
				"needs a session of its own, which transaction pooling does not give: set -listen-database-url to a direct URL " +
				"(or to this one if the pooler pools sessions), or turn notifications off with -notify=false; see docs/operating.md")
		}
		logger.Info("a connection pooler is between the service and PostgreSQL; using the query mode the database URL sets",
			slog.String("default_query_exec_mode", mode.String()))
		return nil
	}
	return errors.New("-database-url (DATABASE_URL): a connection pooler (PgBouncer?) is between the service and PostgreSQL, and pgx's default statement cache " +
		"breaks under transaction pooling (prepared statements land on server connections other clients use): add default_query_exec_mode=exec to the URL " +
		"(or default_query_exec_mode=cache_statement if the pooler pools sessions), and give the NOTIFY listener a direct URL (-listen-database-url); see docs/operating.md")
}

// urlSetsExecMode reports whether the database URL (or key=value string)
// chooses pgx's default_query_exec_mode.
func urlSetsExecMode(databaseURL string) bool {
	cfg, err := pgconn.ParseConfig(databaseURL)
	if err != nil {
		return false
	}
	_, ok := cfg.RuntimeParams["default_query_exec_mode"]
	return ok
}

// warmPool opens every connection of pool before the service says SERVING:
// opened on demand, a fresh replica's first burst of Begins waits for a
// pool's worth of connection setups at once (over 500ms under load). A
// database that refuses some (max_connections) is logged, not fatal: the
// rest open on demand, as before.
func warmPool(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	size := int(pool.Config().MaxConns)
	conns := make([]*pgxpool.Conn, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	// Held until all are acquired, so each Acquire opens its own.
	for i := range size {
		wg.Go(func() { conns[i], errs[i] = pool.Acquire(ctx) })
	}
	wg.Wait()
	opened := 0
	for _, c := range conns {
		if c != nil {
			opened++
			c.Release()
		}
	}
	if err := errors.Join(errs...); err != nil {
		logger.Warn("could not open the whole database pool before serving; the rest open on demand",
			slog.Int("opened", opened), slog.Int("size", size), slog.Any("error", err))
	}
}

// redactedURL drops the password from a database URL for logging.
func redactedURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// ListenAndServe runs the Dedupe service on cfg.Listen, as dedupesvc does,
// and listens there only once it can serve: its store open (migrated under
// MigrateOnStart, its resume mark made), its gRPC server and health service
// registered, /metrics on cfg.MetricsListen up. Until then a connection is
// refused, so a TCP readiness check passes only when a Begin would be
// served. A listen address taken by another process is reported, naming
// its flag, before the store opens (on unix; elsewhere once it has), not
// after the migrations. It stops as Serve does.
func ListenAndServe(ctx context.Context, cfg Config, logger *slog.Logger) error {
	if err := checkListen(ctx, cfg.Listen); err != nil {
		return fmt.Errorf("%s %s: %w", cfg.name("listen"), cfg.Listen, err)
	}
	if cfg.MetricsListen != "" {
		if err := checkListen(ctx, cfg.MetricsListen); err != nil {
			return fmt.Errorf("%s %s: %w", cfg.name("metrics-listen"), cfg.MetricsListen, err)
		}
	}
	if cfg.ConsoleListen != "" {
		if err := checkListen(ctx, cfg.ConsoleListen); err != nil {
			return fmt.Errorf("%s %s: %w", cfg.name("console-listen"), cfg.ConsoleListen, err)
		}
	}
	return serve(ctx, cfg, logger, func() (net.Listener, error) {
		lis, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", cfg.name("listen"), cfg.Listen, err)
		}
		return lis, nil
	})
}

// Serve runs the Dedupe service on lis until ctx is done, then stops
// gracefully: health turns NOT_SERVING first, in-flight calls get
// cfg.ShutdownTimeout to finish, and the rest are cut. It returns nil after a
// clean stop. lis, bound already, completes connections while the store
// opens, before they are served: for a port a readiness check may probe,
// use ListenAndServe.
func Serve(ctx context.Context, cfg Config, lis net.Listener, logger *slog.Logger) error {
	return serve(ctx, cfg, logger, func() (net.Listener, error) { return lis, nil })
}

// serve is Serve on the listener listen returns, called once the service
// can serve.
func serve(ctx context.Context, cfg Config, logger *slog.Logger, listen func() (net.Listener, error)) error {
	cfg = cfg.withDefaults()
	// Before the store opens: a bad file is the operator's to fix, told
	// before any migration runs.
	descriptors, err := consoleDescriptors(cfg)
	if err != nil {
		return err
	}
	svc, err := openService(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer svc.close(ctx)
	registry := svc.registry
	grpcMetrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	registry.MustRegister(grpcMetrics)
	grpcOpts, authenticator, err := securityOptions(cfg, registry, logger)
	if err != nil {
		return err
	}
	// With authentication, strangers are bounded before they authenticate:
	// calls without credentials are refused from their headers, and
	// unauthenticated connections and health checks are capped below the
	// limits of the callers that authenticate (preauthGate).
	var gate *preauthGate
	var taps []tap.ServerInHandle
	if authenticator != nil {
		gate = newPreauthGate(authenticator, cfg)
		registry.MustRegister(gate)
		taps = append(taps, gate.tapHandle)
		registry.MustRegister(authenticator)
		if cfg.TokenFile != "" {
			svc.goBackground(func(background context.Context) {
				watchTokenFile(background, cfg.TokenFile, cfg.TokenReloadInterval, authenticator, logger)
			})
		}
	}
	tracing, stopTracing, err := tracingOption(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer stopTracing()
	grpcOpts = append(grpcOpts, tracing...)
	grpcOpts = append(grpcOpts, limitOptions(cfg)...)
	// Bounded input: headers (keys, tokens, scopes) fit in 16 KiB, and no
	// message is larger than the largest outcome plus its envelope.
	grpcOpts = append(grpcOpts, grpc.MaxHeaderListSize(maxHeaderBytes), grpc.MaxRecvMsgSize(cfg.MaxOutcomeBytes+envelopeBytes))
	// Every call is counted, refused ones included; a request that does not
	// parse is refused before anything reads it; authentication comes before
	// the logging of calls, so a flood of refusals is logged at its own
	// limited rate.
	codec := newRequestCodec()
	unary := []grpc.UnaryServerInterceptor{grpcMetrics.UnaryServerInterceptor(), codec.unaryInterceptor()}
	stream := []grpc.StreamServerInterceptor{grpcMetrics.StreamServerInterceptor(), codec.streamInterceptor()}
	if authenticator != nil {
		unary = append(unary, authenticator.UnaryServerInterceptor())
		stream = append(stream, authenticator.StreamServerInterceptor())
	}
	unary = append(unary, logging.UnaryServerInterceptor(grpcLogger(logger), logging.WithLevels(codeLevel)))
	// grpc-go takes one tap handle: the checks made before a request is
	// read run in it one after another, the first refusal winning.
	taps = append(taps, finishTap(authenticator, svc.server))
	grpcOpts = append(grpcOpts, grpc.ForceServerCodecV2(codec), grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...),
		grpc.InTapHandle(chainTaps(taps)))
	healthSrv := health.NewServer()
	srv := grpc.NewServer(grpcOpts...)
	service := svc.server
	idemgatev1.RegisterDedupeServiceServer(srv, service)
	admin, err := dedupesvc.NewAdminServer(svc.store, service)
	if err != nil {
		return err
	}
	idemgatev1.RegisterAdminServiceServer(srv, admin)
	healthpb.RegisterHealthServer(srv, healthSrv)
	healthSrv.SetServingStatus(idemgatev1.DedupeService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	if cfg.Reflection {
		reflection.Register(srv)
	}
	grpcMetrics.InitializeMetrics(srv)
	if cfg.MetricsListen != "" {
		stopMetrics, err := serveMetrics(cfg.name("metrics-listen"), cfg.MetricsListen, registry, logger)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}
	if cfg.ConsoleListen != "" {
		stopConsole, err := serveConsole(cfg, svc, admin, authenticator, descriptors, logger)
		if err != nil {
			return err
		}
		defer stopConsole()
	}
	// Last: a connection completed from here on is served.
	lis, err := listen()
	if err != nil {
		return err
	}

	serveErr := make(chan error, 1)
	served := netutil.LimitListener(lis, cfg.MaxConnections)
	if gate != nil {
		served = gate.listener(served)
	}
	go func() { serveErr <- srv.Serve(served) }()
	logger.Info("dedupe service serving", slog.String("address", lis.Addr().String()))

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down: health NOT_SERVING, draining in-flight calls", slog.Duration("timeout", cfg.ShutdownTimeout))
	healthSrv.Shutdown()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(cfg.ShutdownTimeout):
		logger.Warn("graceful stop timed out; cutting the remaining calls")
		srv.Stop()
		<-stopped
	}
	// No replay is served any more: svc.close stores what was counted since
	// the last flush, before the store closes.
	if err := <-serveErr; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	logger.Info("stopped")
	return nil
}

// grpcLogger adapts slog to go-grpc-middleware's logging interceptor.
func grpcLogger(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
}

// codeLevel logs the answers that are part of normal deduplication (a
// refused stale Finish, a bad request from a client) below warnings, and
// store trouble as errors.
func codeLevel(code codes.Code) logging.Level {
	switch code {
	case codes.OK:
		return logging.LevelDebug
	case codes.InvalidArgument, codes.FailedPrecondition, codes.Canceled, codes.DeadlineExceeded:
		return logging.LevelInfo
	case codes.Unavailable, codes.Internal, codes.Unknown, codes.DataLoss:
		return logging.LevelError
	default:
		return logging.LevelWarn
	}
}

// ServeMetrics serves registry at http://addr/metrics until the returned
// function is called; the Dedupe service's -metrics-listen, and a tool
// server's.
func ServeMetrics(addr string, registry *prometheus.Registry, logger *slog.Logger) (func(), error) {
	return serveMetrics(flagName("metrics-listen"), addr, registry, logger)
}

// serveMetrics is ServeMetrics, its errors naming the setting name.
func serveMetrics(name, addr string, registry *prometheus.Registry, logger *slog.Logger) (func(), error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", name, addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	// The HTTP listeners' defaults (timeouts, 512 connections, 64 per
	// client address): a scraper needs one.
	limits := httplimits.Limits{ReadHeaderTimeout: 5 * time.Second}
	httpSrv := limits.Server(mux)
	go func() {
		if err := httpSrv.Serve(limits.Listener(lis)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics endpoint failed", slog.Any("error", err))
		}
	}()
	logger.Info("metrics serving", slog.String("address", "http://"+lis.Addr().String()+"/metrics"))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = httpSrv.Shutdown(ctx)
	}, nil
}

// chainTaps runs taps in order, each with the context the one before it
// returned, and stops at the first refusal.
func chainTaps(taps []tap.ServerInHandle) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		for _, t := range taps {
			var err error
			if ctx, err = t(ctx, info); err != nil {
				return ctx, err
			}
		}
		return ctx, nil
	}
}

// finishTap refuses a Finish as it arrives, before its request (up to a
// megabyte) is read, when its caller's Finishes in flight or its outcome
// byte rate cannot take it (Server.AdmitFinishCall), at the size its gate
// declares (dedupesvc.OutcomeBytesHeader) or, undeclared or not a number,
// at the largest outcome. A call whose caller cannot be established is let
// through: authentication refuses, counts and logs it.
func finishTap(a *auth.Authenticator, srv *dedupesvc.Server) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if info.FullMethodName != idemgatev1.DedupeService_Finish_FullMethodName {
			return ctx, nil
		}
		name := "" // no authentication: every caller is the one namespace
		if a != nil {
			caller, err := a.Authenticate(ctx)
			if err != nil {
				return ctx, nil
			}
			name = caller.Name
		}
		declared := -1
		if v := info.Header.Get(dedupesvc.OutcomeBytesHeader); len(v) == 1 {
			if n, err := strconv.Atoi(v[0]); err == nil && n >= 0 {
				declared = n
			}
		}
		ctx, err := srv.AdmitFinishCall(ctx, name, declared)
		if delay, ok := grpcerr.RetryDelay(err); ok {
			// A tap handle runs on its connection's reader: holding the
			// refusal for its retry delay stops reading that connection,
			// so a caller that ignores the delay is slowed by TCP itself
			// instead of costing the service a refused stream (and the
			// data it already sent) each time. Other connections are read
			// on their own goroutines.
			time.Sleep(min(delay, maxFinishRefusalHold))
		}
		return ctx, err
	}
}

// maxFinishRefusalHold bounds how long a refused Finish holds its
// connection's reader (finishTap): long enough to pace a caller that ignores
// RetryInfo, short enough for its other calls and keepalive pings.
const maxFinishRefusalHold = 100 * time.Millisecond

// limitOptions bound what one connection, and one idle or slow client, can
// hold: calls per connection, the handshake, idle and old connections, and
// how often a client may ping.
func limitOptions(cfg Config) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(uint32(cfg.MaxConcurrentStreams)),
		grpc.ConnectionTimeout(cfg.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     cfg.MaxConnectionIdle,
			MaxConnectionAge:      cfg.MaxConnectionAge,
			MaxConnectionAgeGrace: cfg.MaxConnectionAgeGrace,
		}),
		// Pings keep an idle connection's liveness known; a client may send
		// them without calls in flight, but not more often than MinTime.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: cfg.KeepaliveMinTime, PermitWithoutStream: true}),
	}
}

// securityOptions turns the TLS and authentication flags into server
// options (TLS credentials, verifying client certificates when a client CA
// is given while still letting token callers in) and the authenticator,
// which runs before the service sees a call; nil when callers do not
// authenticate. The certificate, key and client CAs are reread when they
// change (tlsfiles), and the expiry of the certificate in force is a gauge
// in registry.
func securityOptions(cfg Config, registry prometheus.Registerer, logger *slog.Logger) ([]grpc.ServerOption, *auth.Authenticator, error) {
	var opts []grpc.ServerOption
	if cfg.TLSCert != "" {
		pair, err := tlsfiles.NewKeyPair("-tls-cert/-tls-key", cfg.TLSCert, cfg.TLSKey, tlsfiles.WithLogger(logger))
		if err != nil {
			return nil, nil, err
		}
		registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idemgate_tls_certificate_expiry_timestamp_seconds",
			Help:        "notAfter of the TLS certificate in force, as a Unix time; a scrape rereads the files if they changed",
			ConstLabels: prometheus.Labels{"certificate": "server"}},
			func() float64 { return float64(pair.NotAfter().Unix()) }))
		var clientCAs *tlsfiles.CAPool
		base := &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.TLSClientCA != "" {
			if clientCAs, err = tlsfiles.NewCAPool("-tls-client-ca", cfg.TLSClientCA, tlsfiles.WithLogger(logger)); err != nil {
				return nil, nil, err
			}
			base.ClientAuth = tls.VerifyClientCertIfGiven
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsfiles.ServerConfig(base, pair, clientCAs))))
	}
	if !cfg.authConfigured() {
		logger.Warn("no authentication configured (-tls-client-ca, -token-file): any local process may call the service; records are not namespaced by caller")
		return opts, nil, nil
	}
	authCfg := auth.Config{AdminIdentities: cfg.AdminIdentities, Forwarders: cfg.AgentForwarders, Logger: logger, LogRate: cfg.AuthRefusalLogRate}
	if cfg.ResolveAdminOnly {
		authCfg.AdminMethods = []string{idemgatev1.DedupeService_Resolve_FullMethodName}
	}
	if cfg.TokenFile != "" {
		tokens, err := readTokenFile(cfg.TokenFile)
		if err != nil {
			return nil, nil, err
		}
		authCfg.Tokens = tokens
	}
	authenticator, err := auth.New(authCfg)
	if err != nil {
		// What auth.New refuses is the tokens, which come from the file.
		return nil, nil, fmt.Errorf("-token-file %s: %w", cfg.TokenFile, err)
	}
	return opts, authenticator, nil
}

// otlpExporterOptions reads the collector endpoint: a URL whose scheme says
// whether to use TLS, or a bare host:port spoken to in plaintext (the form the
// flag first took). The exporter itself would quietly fall back to
// localhost on a URL it cannot parse, so a bad one is refused here.
func otlpExporterOptions(endpoint string) ([]otlptracegrpc.Option, error) {
	if endpoint == "" {
		return nil, nil
	}
	if !strings.Contains(endpoint, "://") {
		if _, _, err := net.SplitHostPort(endpoint); err != nil {
			return nil, fmt.Errorf("-otlp-endpoint %q: want https://host:port, http://host:port or host:port: %w", endpoint, err)
		}
		return []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(endpoint), otlptracegrpc.WithInsecure()}, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("-otlp-endpoint %q: want https://host:port (TLS), http://host:port or host:port (plaintext)", endpoint)
	}
	return []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(endpoint)}, nil
}

// tracingOption returns the otelgrpc stats handler when tracing is on: with
// cfg.TracerProvider, or an OTLP/gRPC exporter to cfg.OTLPEndpoint. Off, it
// returns nothing and the server pays nothing.
func tracingOption(ctx context.Context, cfg Config, logger *slog.Logger) ([]grpc.ServerOption, func(), error) {
	provider := cfg.TracerProvider
	stop := func() {}
	if provider == nil {
		if cfg.OTLPEndpoint == "" {
			return nil, stop, nil
		}
		opts, err := otlpExporterOptions(cfg.OTLPEndpoint)
		if err != nil {
			return nil, nil, err
		}
		exporter, err := otlptracegrpc.New(ctx, opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("-otlp-endpoint %s: OTLP exporter: %w", cfg.OTLPEndpoint, err)
		}
		sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter),
			sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "idemgate-dedupesvc"))))
		provider = sdk
		stop = func() {
			shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = sdk.Shutdown(shutdownCtx)
		}
		logger.Info("tracing to OTLP", slog.String("endpoint", cfg.OTLPEndpoint))
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(provider)))}, stop, nil
}

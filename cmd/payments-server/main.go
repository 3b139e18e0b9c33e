// Command payments-server runs the example PaymentsService tool server,
// gated by the idemgate interceptor against a running dedupe service. It
// checks the Dedupe service at start (logging the result; it starts either
// way), logs failing Dedupe RPCs, and serves the gRPC health service with
// idemgate.dedupe SERVING only while the Dedupe service answers.
//
//	payments-server [-listen 127.0.0.1:50052] [-dedupe 127.0.0.1:50051] [-reflection]
//	                [-replay-cache-entries 0] [-replay-cache-bytes 67108864]
//	                [-finish-after-reply]
//	payments-server -dedupe in-process [flags] [-- dedupesvc flags]
//
// With -reflection it also serves gRPC server reflection, so grpcurl and
// other generic clients can list the service and decode the
// google.rpc.ErrorInfo and RetryInfo details of its errors.
//
// With -replay-cache-entries above 0 it keeps the outcomes of completed calls
// in memory (interceptor.WithReplayCache, at most that many and about
// -replay-cache-bytes in all, each served for at most
// interceptor.DefaultReplayCacheTTL), so a duplicate is replayed without a
// call to the Dedupe service.
//
// With -dedupe in-process it runs the Dedupe service itself, inside this
// process, and the gate calls it in-process (dedupesvc/embedded, the public
// package an adopter's tool server uses too: no network hop, no
// authentication). That service is dedupesvc's, and is configured as
// dedupesvc is: by the dedupesvc flags after "--" (embedded.ParseFlags; and
// by their environment variables, DATABASE_URL, IDEMGATE_CALLER_BEGIN_RATE
// and the rest), the embedded SQLite store in -data-dir when no
// -database-url is set; the flags of dedupesvc's gRPC server (-tls-*,
// -token-file, ...) are refused. payments-server -dedupe in-process -- -h
// lists them.
//
// With -finish-after-reply ChargeCard answers its caller before its outcome
// is stored (finish: FINISH_POLICY_AFTER_REPLY), and the Finish runs right
// after, in the background; the proto declares the default,
// FINISH_POLICY_BEFORE_REPLY, and so does the server without the flag.
// With -metrics-listen it serves the gate's Prometheus metrics at /metrics:
// what the gate did (idemgate_interceptor_calls_total, _events_total) and
// where a gated call's time goes (idemgate_interceptor_stage_seconds).
// With -connect-listen it also serves the service over Connect, gRPC and
// gRPC-Web (HTTP/1.1 and h2c) on that address, gated by connectgate on the
// same Dedupe service and ledger: one key is one charge on either listener.
// That listener takes
// -read-header-timeout (10s), -read-timeout (30s), -write-timeout (30s, each
// write of an answer once it starts), -idle-timeout (2m), -max-connections
// (512) and -max-connections-per-ip (64; an IPv6 client by its /64).
// Every flag also reads an environment variable; payments-server -h lists
// them. payments-server -version prints the version and the commit it was
// built from.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/dedupesvc/embedded"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/httpgate"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/httplimits"
	"github.com/idemgate/idemgate/internal/version"
)

// defaultReplayCacheBytes is -replay-cache-bytes' default: 64 MiB.
const defaultReplayCacheBytes = 64 << 20

// config is the server's settings, from flags and the environment.
type config struct {
	listen, dedupeAddr, token string
	reflection                bool
	// replayCacheEntries and replayCacheBytes bound the replay cache;
	// replayCacheEntries 0 turns it off.
	replayCacheEntries, replayCacheBytes int
	// finishAfterReply gives ChargeCard finish: FINISH_POLICY_AFTER_REPLY
	// in place of the proto's default.
	finishAfterReply bool
	// metricsListen is where /metrics is served (the gate's metrics,
	// interceptor.WithRegisterer); "" serves none.
	metricsListen string
	// connectListen is where the service is also served over Connect,
	// gRPC and gRPC-Web (h2c), gated by connectgate; "" serves none.
	connectListen string
	// http bounds the -connect-listen HTTP listener's connections:
	// -read-timeout, -max-connections-per-ip and the rest.
	http httplimits.Limits
	// inProcess, set by -dedupe in-process, configures the Dedupe service
	// this process runs itself; nil calls the one at dedupeAddr.
	inProcess *embedded.Config
	// registry, set by run when metricsListen is, holds the gate's metrics.
	registry *prometheus.Registry
}

// inProcessDedupe is the -dedupe value that runs the Dedupe service inside
// this process.
const inProcessDedupe = "in-process"

func main() {
	cfg, err := parseConfig(os.Args[1:], os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if errors.Is(err, version.ErrRequested) {
		version.Print(os.Stdout, "payments-server")
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments-server:", err)
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(cfg, logger); err != nil {
		logger.Error("payments-server failed", slog.Any("error", err))
		os.Exit(1)
	}
	logger.Info("stopped")
}

// parseConfig reads args (without the program name) and the environment
// through lookupEnv. It returns flag.ErrHelp after printing usage for -h, and
// version.ErrRequested for -version, checking nothing else.
func parseConfig(args []string, lookupEnv func(string) (string, bool), usage io.Writer) (config, error) {
	fs := flag.NewFlagSet("payments-server", flag.ContinueOnError)
	fs.SetOutput(usage)
	var cfg config
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:50052", "gRPC listen `address` of the tool server")
	fs.StringVar(&cfg.dedupeAddr, "dedupe", "127.0.0.1:50051", "`address` of the dedupe service, or in-process to run it in this process, configured by the dedupesvc flags after -- "+
		"(payments-server -dedupe in-process -- -h lists them)")
	fs.StringVar(&cfg.token, "dedupe-token", "", "bearer `token` for a dedupe service started with -token-file")
	fs.BoolVar(&cfg.reflection, "reflection", false, "serve gRPC server reflection, for grpcurl and other generic clients")
	fs.IntVar(&cfg.replayCacheEntries, "replay-cache-entries", 0,
		"keep up to `n` completed outcomes in memory and replay duplicates from there, without a call to the dedupe service; "+
			"0, the default, turns the replay cache off")
	fs.IntVar(&cfg.replayCacheBytes, "replay-cache-bytes", defaultReplayCacheBytes,
		"about how many `bytes` of memory the replay cache may hold (64 MiB); only with -replay-cache-entries")
	fs.BoolVar(&cfg.finishAfterReply, "finish-after-reply", false,
		"ChargeCard answers before its outcome is stored (finish: FINISH_POLICY_AFTER_REPLY) and stores it right after; "+
			"off, the proto's default, it stores the outcome first")
	fs.StringVar(&cfg.metricsListen, "metrics-listen", "",
		"serve the gate's Prometheus metrics (idemgate_interceptor_*, where a gated call's time goes among them) at http://`address`/metrics; "+
			"empty, the default, serves none")
	fs.StringVar(&cfg.connectListen, "connect-listen", "",
		"also serve the payments service over Connect, gRPC and gRPC-Web (HTTP/1.1 and h2c) at http://`address`, gated by connectgate on the same Dedupe service; "+
			"empty, the default, serves none")
	cfg.http.RegisterFlags(fs)
	env := cliflag.Bind(fs, "PAYMENTS_", lookupEnv,
		cliflag.WithName("dedupe", "IDEMGATE_DEDUPE_ADDR"),
		cliflag.WithName("dedupe-token", "IDEMGATE_DEDUPE_TOKEN"))
	showVersion := version.Flag(fs) // after Bind: no variable
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if *showVersion {
		return config{}, version.ErrRequested
	}
	// A variable that does not parse fails here, before the checks below
	// would read its flag's zero.
	if err := env.Apply(); err != nil {
		return config{}, err
	}
	switch rest := fs.Args(); {
	case cfg.dedupeAddr == inProcessDedupe:
		if cfg.token != "" {
			return config{}, errors.New("-dedupe-token is set, but -dedupe in-process has no Dedupe service to send it to: its only caller is this process")
		}
		dcfg, err := embedded.ParseFlags("payments-server -dedupe in-process --", rest, lookupEnv, usage)
		if err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return config{}, err
			}
			return config{}, fmt.Errorf("-dedupe in-process: %w", err)
		}
		cfg.inProcess = &dcfg
	case len(rest) > 0:
		return config{}, fmt.Errorf("unexpected argument %q: arguments after the flags are dedupesvc flags, for -dedupe %s only", rest[0], inProcessDedupe)
	}
	if err := cfg.http.Check("-"); err != nil {
		return config{}, err
	}
	switch {
	case cfg.replayCacheEntries < 0:
		return config{}, fmt.Errorf("-replay-cache-entries must be 0 (off) or more, got %d", cfg.replayCacheEntries)
	case cfg.replayCacheBytes <= 0:
		return config{}, fmt.Errorf("-replay-cache-bytes must be positive, got %d", cfg.replayCacheBytes)
	case cfg.replayCacheEntries == 0 && env.Configured("replay-cache-bytes"):
		return config{}, errors.New("-replay-cache-bytes is set but -replay-cache-entries is 0, which leaves the replay cache off: " +
			"set -replay-cache-entries too, or drop -replay-cache-bytes")
	}
	return cfg, nil
}

// replayCache describes the replay cache for the start-up line.
func (c config) replayCache() string {
	if c.replayCacheEntries == 0 {
		return "off"
	}
	return fmt.Sprintf("entries=%d bytes=%d ttl=%s", c.replayCacheEntries, c.replayCacheBytes, interceptor.DefaultReplayCacheTTL)
}

// newGate builds the gate cfg describes, calling the Dedupe service through
// client, with extra options after the ones cfg sets.
func newGate(cfg config, client idemgatev1.DedupeServiceClient, extra ...interceptor.Option) (*interceptor.Gate, error) {
	var opts []interceptor.Option
	if cfg.registry != nil {
		opts = append(opts, interceptor.WithRegisterer(cfg.registry))
	}
	if cfg.replayCacheEntries > 0 {
		opts = append(opts, interceptor.WithReplayCache(cfg.replayCacheEntries, cfg.replayCacheBytes))
	}
	if cfg.finishAfterReply {
		files, err := finishAfterReplyFiles(paymentsv1.PaymentsService_ChargeCard_FullMethodName)
		if err != nil {
			return nil, fmt.Errorf("-finish-after-reply: %w", err)
		}
		opts = append(opts, interceptor.WithFiles(files))
	}
	return interceptor.New(client, append(opts, extra...)...)
}

// finishAfterReplyFiles returns the descriptors linked into the binary
// (protoregistry.GlobalFiles) with the (idemgate.v1.policy) of fullMethod
// ("/pkg.Service/Method") saying finish: FINISH_POLICY_AFTER_REPLY. The
// interceptor takes a method's policy from its descriptor alone, so this is
// how a flag changes one: the rest of that policy, and every other method,
// stay as the protos declare them.
func finishAfterReplyFiles(fullMethod string) (*protoregistry.Files, error) {
	service, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok {
		return nil, fmt.Errorf("%q is not a full method name /pkg.Service/Method", fullMethod)
	}
	sd, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return nil, fmt.Errorf("service of %s: %w", fullMethod, err)
	}
	target := sd.ParentFile()
	fdp := protodesc.ToFileDescriptorProto(target)
	found := false
	for _, s := range fdp.GetService() {
		if target.Package().Append(protoreflect.Name(s.GetName())) != protoreflect.FullName(service) {
			continue
		}
		for _, m := range s.GetMethod() {
			if m.GetName() != method {
				continue
			}
			opts := m.GetOptions()
			if opts == nil || !proto.HasExtension(opts, idemgatev1.E_Policy) {
				return nil, fmt.Errorf("%s has no (idemgate.v1.policy) to change", fullMethod)
			}
			policy := proto.CloneOf(proto.GetExtension(opts, idemgatev1.E_Policy).(*idemgatev1.MethodPolicy))
			policy.Finish = idemgatev1.FinishPolicy_FINISH_POLICY_AFTER_REPLY
			proto.SetExtension(opts, idemgatev1.E_Policy, policy)
			found = true
		}
	}
	if !found {
		return nil, fmt.Errorf("no method %s in %s", fullMethod, target.Path())
	}
	changed, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		return nil, fmt.Errorf("rebuild %s: %w", target.Path(), err)
	}
	files := new(protoregistry.Files)
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if fd.Path() == target.Path() {
			fd = changed
		}
		err = files.RegisterFile(fd)
		return err == nil
	})
	if err != nil {
		return nil, err
	}
	return files, nil
}

func run(cfg config, logger *slog.Logger) error {
	logger.Info("payments-server starting", version.Attr())
	if cfg.metricsListen != "" {
		cfg.registry = prometheus.NewRegistry()
		stop, err := serveMetrics(cfg.metricsListen, cfg.registry, logger)
		if err != nil {
			return err
		}
		defer stop()
	}
	if cfg.inProcess != nil {
		dcfg := *cfg.inProcess
		dcfg.Logger = dcfg.Logger.With(slog.String("dedupe", inProcessDedupe))
		svc, err := embedded.Start(context.Background(), dcfg)
		if err != nil {
			return fmt.Errorf("-dedupe %s: %w", inProcessDedupe, err)
		}
		defer svc.Close() // after gate.Close, deferred later: its Finishes go here
		gate, err := newGate(cfg, svc.Client(), interceptor.WithLogger(logger))
		if err != nil {
			return err
		}
		return serve(cfg, gate, svc.Client(), nil, logger)
	}
	// Plaintext is for this loopback example only; use TLS between machines.
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig),
		// Drops a connection left half-open (a crashed host, a partition),
		// which WithDedupeConn cannot: its RPCs end DEADLINE_EXCEEDED. Time
		// no shorter than the service's -keepalive-min-time (10s).
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 15 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
	}
	if cfg.token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(auth.BearerToken(cfg.token, true)))
	}
	conn, err := grpc.NewClient(cfg.dedupeAddr, dial...)
	if err != nil {
		return fmt.Errorf("dedupe client: %w", err)
	}
	defer conn.Close()
	// WithDedupeConn: failing Dedupe RPCs are logged with its address, and
	// WatchDedupe follows the connection.
	gate, err := newGate(cfg, idemgatev1.NewDedupeServiceClient(conn), interceptor.WithLogger(logger), interceptor.WithDedupeConn(conn))
	if err != nil {
		return err
	}
	return serve(cfg, gate, idemgatev1.NewDedupeServiceClient(conn), conn, logger)
}

// serve serves the payments service gated by gate on cfg.listen (and over
// Connect on cfg.connectListen, gated through dedupe on conn, nil for the
// service in this process) until SIGINT or SIGTERM, then closes the gate.
func serve(cfg config, gate *interceptor.Gate, dedupe idemgatev1.DedupeServiceClient, conn *grpc.ClientConn, logger *slog.Logger) error {
	srv := grpc.NewServer(gate.ServerOptions( // map fields in key order, so a replay's bytes are the first answer's
		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor()), // a panicking handler is a lost outcome; the gate re-panics it
	)...)
	svc := &payments.Server{Ledger: &payments.Ledger{}}
	paymentsv1.RegisterPaymentsServiceServer(srv, svc)
	// The server itself serves ("") whatever the Dedupe service does, so
	// its reads keep working; idemgate.dedupe says whether gated calls can.
	healthSrv := health.NewServer()
	healthpb.RegisterHealthServer(srv, healthSrv)
	if err := gate.CheckServer(srv); err != nil {
		return err // a served method nobody classified
	}
	if cfg.reflection {
		// After CheckServer, which ignores gRPC's own grpc.* services.
		// Reflection answers for every file linked into the binary, the
		// google.rpc error details included.
		reflection.Register(srv)
	}

	lis, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("-listen %s: %w", cfg.listen, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Not fatal: the Dedupe service may come up after the tool server, and
	// gated calls fail closed until it does.
	checkCtx, cancelCheck := context.WithTimeout(ctx, 5*time.Second)
	if err := gate.CheckDedupe(checkCtx); err != nil {
		logger.Warn("the Dedupe service does not serve this tool server yet; gated calls fail closed until it does",
			slog.String("dedupe", cfg.dedupeAddr), slog.Any("error", err))
	} else {
		logger.Info("the Dedupe service serves this tool server", slog.String("dedupe", cfg.dedupeAddr))
	}
	cancelCheck()
	go gate.WatchDedupe(ctx, healthSrv)
	if cfg.connectListen != "" {
		stopConnect, err := serveConnect(ctx, cfg, svc, dedupe, conn, logger)
		if err != nil {
			return err
		}
		defer stopConnect()
	}
	go func() {
		<-ctx.Done()
		logger.Info("stopping on a signal: no new calls, waiting for the calls in flight (graceful stop)")
		srv.GracefulStop()
	}()
	defer func() {
		// Outcomes whose Finish is still being retried get a last chance.
		closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := gate.Close(closeCtx); err != nil {
			logger.Error("outcomes still unstored at exit", slog.Any("error", err))
			return
		}
		logger.Info("calls drained, gate closed: every outcome stored")
	}()
	logger.Info("payments tool server serving", slog.String("address", lis.Addr().String()), slog.String("dedupe", cfg.dedupeAddr),
		slog.String("replay_cache", cfg.replayCache()),
		slog.String("ChargeCard", gate.Policy(paymentsv1.PaymentsService_ChargeCard_FullMethodName).String()),
		slog.String("SendReceipt", gate.Policy(paymentsv1.PaymentsService_SendReceipt_FullMethodName).String()),
		slog.String("GetBalance", gate.Policy(paymentsv1.PaymentsService_GetBalance_FullMethodName).String()))
	return srv.Serve(lis)
}

// serveMetrics serves registry at addr's /metrics until the returned stop is
// called, with httpgate.ServerLimits' defaults (timeouts, connection caps per
// client address): a scraper needs one connection, a stranger gets no more.
// Written from public packages only, as a copy of this server must be.
func serveMetrics(addr string, registry *prometheus.Registry, logger *slog.Logger) (stop func(), err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-metrics-listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	limits := httpgate.ServerLimits{ReadHeaderTimeout: 5 * time.Second}
	srv := limits.Server(mux)
	go func() {
		if err := srv.Serve(limits.Listener(lis)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics endpoint failed", slog.Any("error", err))
		}
	}()
	logger.Info("metrics serving", slog.String("address", "http://"+lis.Addr().String()+"/metrics"))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

package dedupeapp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// service is the Dedupe service without a gRPC server: the store, the
// dedupesvc.Server over it with cfg's limits, its metrics, and its
// background work (notifications, replay counts, outcome keys, the
// sweeper, the unknown-records gauge). Serve puts a gRPC server in front of
// it; Embed hands it to an in-process client. One place builds it, so the
// two cannot drift apart.
type service struct {
	backend
	registry *prometheus.Registry
	// collectors are the service's own metrics in registry (not the Go
	// runtime's and the process's), for a registry of the embedding
	// process's.
	collectors []prometheus.Collector
	server     *dedupesvc.Server
	replays    *dedupesvc.ReplayRecorder
	logger     *slog.Logger

	background     context.Context
	stopBackground context.CancelFunc
	backgroundDone sync.WaitGroup
}

// openService opens the store cfg (with its defaults) selects and starts
// the service's background work, which runs until close, whatever becomes
// of ctx.
func openService(ctx context.Context, cfg Config, logger *slog.Logger) (_ *service, err error) {
	b, err := openBackend(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	s := &service{backend: b, registry: prometheus.NewRegistry(), logger: logger}
	s.background, s.stopBackground = context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		if err != nil {
			s.close(ctx)
		}
	}()

	dedupeMetrics := dedupesvc.NewMetrics()
	s.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.register(dedupeMetrics)
	if b.pool != nil {
		s.register(newPoolCollector(b.pool))
	}
	if away, ok := b.store.(awayStats); ok {
		s.register(newAwayCollector(away))
	}
	serverOpts := []dedupesvc.Option{
		dedupesvc.WithMetrics(dedupeMetrics),
		dedupesvc.WithLogger(logger),
		dedupesvc.WithPollInterval(cfg.PollInterval),
		dedupesvc.WithUnknownRetention(cfg.UnknownRetention),
		dedupesvc.WithMaxOutcomeBytes(cfg.MaxOutcomeBytes),
		dedupesvc.WithCallerRate(cfg.CallerBeginRate, cfg.CallerBeginBurst),
		dedupesvc.WithCallerQuota(cfg.CallerMaxRecords, cfg.CallerMaxBytes),
		dedupesvc.WithCallerOutcomeRate(cfg.CallerOutcomeByteRate, cfg.CallerOutcomeByteBurst),
		dedupesvc.WithMaxFinishBytesInFlight(cmp.Or(cfg.MaxFinishBytesInFlight, dedupesvc.DefaultMaxFinishBytesInFlight)),
		// Under -resolve-admin-only only Resolve settles an unknown record:
		// not the late Finish or Release of the attempt that lost it.
		dedupesvc.WithResolveOnlySettlesUnknown(cfg.ResolveAdminOnly),
		dedupesvc.WithPlaintextOutcomes(cfg.OutcomeAcceptPlaintext),
	}
	if b.pool != nil {
		// Begins keep a quarter of the pool free for the renewals and
		// Finishes of the calls already running.
		n := cfg.MaxConcurrentBegins
		if n == 0 {
			n = max(1, int(b.pool.Config().MaxConns)*3/4)
		}
		serverOpts = append(serverOpts, dedupesvc.WithMaxConcurrentBegins(n))
	}
	if cfg.MaxRetention > 0 { // zero in a Config built in Go: the default
		serverOpts = append(serverOpts, dedupesvc.WithMaxRetention(cfg.MaxRetention))
	}
	if cfg.MaxWaiters > 0 && cfg.CallerMaxWaiters > 0 {
		serverOpts = append(serverOpts, dedupesvc.WithMaxWaiters(cfg.MaxWaiters, cfg.CallerMaxWaiters))
	}
	if b.notifier != nil {
		serverOpts = append(serverOpts, dedupesvc.WithNotifier(b.notifier))
	}
	if counter, ok := b.store.(dedupesvc.ReplayCounter); ok {
		s.replays = dedupesvc.NewReplayRecorder(counter, dedupesvc.ReplayRecorderConfig{Interval: cfg.ReplayFlushInterval, Logger: logger, Metrics: dedupeMetrics})
		serverOpts = append(serverOpts, dedupesvc.WithReplayRecorder(s.replays))
		s.goBackground(s.replays.Run)
	}
	cipher, err := outcomeCipher(cfg.OutcomeKeysFile)
	if err != nil {
		return nil, err
	}
	if cipher != nil {
		serverOpts = append(serverOpts, dedupesvc.WithOutcomeCipher(cipher))
		logger.Info("stored outcomes are encrypted", slog.String("path", cfg.OutcomeKeysFile), slog.String("active_key_id", cipher.ActiveKeyID()))
		s.goBackground(func(background context.Context) {
			watchOutcomeKeysFile(background, cfg.OutcomeKeysFile, cipher, logger)
		})
	}
	if b.run != nil {
		s.goBackground(b.run)
	}
	s.server = dedupesvc.NewServer(b.store, serverOpts...)

	if compactor, ok := b.store.(dedupesvc.UsageCompactor); ok {
		s.goBackground(func(background context.Context) {
			dedupesvc.RunUsageCompactionWith(background, compactor, dedupesvc.UsageCompactionConfig{
				Interval: cfg.UsageCompactionInterval, Logger: logger, Metrics: dedupeMetrics,
			})
		})
	}
	sweeper := dedupesvc.NewSweeper(b.store, dedupesvc.SweeperConfig{Interval: cfg.SweepInterval, BatchSize: cfg.SweepBatch, Logger: logger})
	s.goBackground(sweeper.Run)
	if inspector, ok := b.store.(dedupesvc.Inspector); ok {
		// Records waiting for an operator, for the IdemgateOutcomeUnknownRecordsWaiting alert.
		unknown := dedupesvc.NewUnknownRecords(inspector, dedupesvc.UnknownRecordsConfig{Logger: logger})
		s.register(unknown)
		s.goBackground(unknown.Run)
	}
	return s, nil
}

// register adds one of the service's own collectors to its registry.
func (s *service) register(c prometheus.Collector) {
	s.registry.MustRegister(c)
	s.collectors = append(s.collectors, c)
}

// goBackground runs f until close, with a context close cancels.
func (s *service) goBackground(f func(context.Context)) {
	s.backgroundDone.Go(func() { f(s.background) })
}

// close stores the replay counts not yet flushed, stops the background
// work and closes the store. Call it once no call is served any more.
func (s *service) close(ctx context.Context) {
	if s.replays != nil {
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if err := s.replays.Flush(flushCtx); err != nil {
			s.logger.Warn("flushing replay counts at shutdown failed; they are dropped", slog.Any("error", err))
		}
		cancel()
	}
	s.stopBackground()
	s.backgroundDone.Wait()
	s.backend.close()
}

// Embedded is a Dedupe service run inside another process, for a tool
// server that has no separate one: the store cfg selects, opened (and
// migrated) as Serve opens it, the service with cfg's caller limits and
// quotas, its background work, and /metrics on cfg.MetricsListen when set.
// There is no gRPC server: Client calls the service in-process.
type Embedded struct {
	svc         *service
	stopMetrics func()
	closeOnce   sync.Once
}

// CheckEmbeddable refuses the fields only a gRPC server uses (TLS, tokens,
// admin identities, reflection, tracing, the console), named by
// name(flag): an embedded service has no callers but its own process to
// authenticate or trace, and a token file silently ignored would look like
// protection.
func CheckEmbeddable(cfg Config, name func(flag string) string) error {
	var errs []error
	for _, f := range []struct {
		flag string
		set  bool
	}{
		{"tls-cert", cfg.TLSCert != ""}, {"tls-key", cfg.TLSKey != ""}, {"tls-client-ca", cfg.TLSClientCA != ""},
		{"token-file", cfg.TokenFile != ""}, {"admin-identities", len(cfg.AdminIdentities) > 0}, {"agent-forwarders", len(cfg.AgentForwarders) > 0},
		{"resolve-admin-only", cfg.ResolveAdminOnly}, {"reflection", cfg.Reflection}, {"otlp-endpoint", cfg.OTLPEndpoint != ""},
		{"console-listen", cfg.ConsoleListen != ""}, {"console-descriptors", cfg.ConsoleDescriptors != ""},
	} {
		if f.set {
			errs = append(errs, errors.New(name(f.flag)+" is set, but an embedded Dedupe service has no gRPC server it applies to: its only caller is this process"))
		}
	}
	return errors.Join(errs...)
}

// Embed starts an embedded Dedupe service configured by cfg, as from
// ParseConfig. The fields only a gRPC server uses (TLS, tokens, admin
// identities, reflection, tracing) are refused rather than ignored: an
// embedded service has no callers but this process to authenticate or
// trace. Close it after the last call through its Client.
func Embed(ctx context.Context, cfg Config, logger *slog.Logger) (*Embedded, error) {
	if err := CheckEmbeddable(cfg, flagName); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	// A taken port is reported now, not after the migrations.
	if cfg.MetricsListen != "" {
		if err := checkListen(ctx, cfg.MetricsListen); err != nil {
			return nil, fmt.Errorf("%s %s: %w", cfg.name("metrics-listen"), cfg.MetricsListen, err)
		}
	}
	svc, err := openService(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	e := &Embedded{svc: svc, stopMetrics: func() {}}
	if cfg.MetricsListen != "" {
		if e.stopMetrics, err = serveMetrics(cfg.name("metrics-listen"), cfg.MetricsListen, svc.registry, logger); err != nil {
			svc.close(ctx)
			return nil, err
		}
	}
	return e, nil
}

// Client returns a client that calls the service in this process
// (dedupesvc.NewInProcessClient): no network hop, and no authentication, so
// the records are in the empty namespace and one caller's limits hold for
// every call.
func (e *Embedded) Client() idemgatev1.DedupeServiceClient {
	return dedupesvc.NewInProcessClient(e.svc.server)
}

// Collectors are the service's own metrics (idemgate_dedupe_*, the
// database pool's, the outcome-unknown records'), without the Go runtime's
// and the process's, which the embedding process registers itself if it
// wants them.
func (e *Embedded) Collectors() []prometheus.Collector { return e.svc.collectors }

// Close stops /metrics, stores the replay counts not yet flushed (for at
// most 5s), stops the background work, waits for it to return and closes
// the store. Calls after the first return at once.
func (e *Embedded) Close() {
	e.closeOnce.Do(func() {
		e.stopMetrics()
		e.svc.close(context.Background())
	})
}

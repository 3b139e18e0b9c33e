// Package embedded runs the Dedupe service inside a tool server, for a
// deployment of one process: no dedupesvc to run beside it, no network hop
// and no authentication between the gate and the service.
//
// Start opens the store (PostgreSQL at Config.DatabaseURL, migrated on
// start, or the embedded SQLite store in Config.DataDir), starts the
// service's background work (the sweeper of expired records, the quotas'
// usage compaction, the replay-count flushes, the NOTIFY listener that wakes
// waiting duplicates, the outcome-unknown records gauge) and returns a
// Service whose Client the gate calls:
//
//	svc, err := embedded.Start(ctx, embedded.Config{DatabaseURL: os.Getenv("DATABASE_URL")})
//	if err != nil { ... }
//	defer svc.Close() // after the gate's Close: its last Finishes go here
//	gate, err := interceptor.New(svc.Client())
//
// It is the service the dedupesvc command runs, minus the gRPC server, and
// the one payments-server -dedupe in-process runs: every Config field is a
// dedupesvc flag with the same meaning and the same default (the two
// exceptions, MetricsListen and Logger, say why), and ParseFlags reads the
// dedupesvc flags and their environment variables into a Config.
//
// Health: there is no gRPC health service to ask; the gate's CheckDedupe
// and WatchDedupe call the service through Client as they would a remote
// one, so a tool server's idemgate.dedupe health follows the store.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/dedupeapp"
)

// Unlimited, in a Config field whose dedupesvc flag turns its limit off
// with 0, turns it off: in a Config 0 takes the flag's default.
const Unlimited = -1

// Config configures the embedded service. It must select one store:
// DatabaseURL (PostgreSQL) or DataDir (the embedded SQLite store); Start
// refuses neither and both. Each other field names the dedupesvc flag it
// is; 0 (or empty, or false) takes that flag's default, given here.
type Config struct {
	// DatabaseURL is the PostgreSQL connection URL (-database-url), the
	// store of a service shared by several processes. Defaults to empty:
	// set it or DataDir.
	DatabaseURL string
	// DataDir is the directory of the embedded SQLite store (-data-dir):
	// one process, one machine; give each tool server its own. Defaults to
	// empty: set it or DatabaseURL. Unlike dedupesvc, which defaults to
	// $XDG_DATA_HOME/idemgate (else ~/.local/share/idemgate), an empty
	// Config never opens that directory, whose store another program may
	// have left; ParseFlags, which reads dedupesvc's flags, keeps their
	// default.
	DataDir string
	// SkipMigrations does not apply pending PostgreSQL migrations at start
	// (-migrate-on-start=false): for a runtime role that may not run DDL,
	// whose schema an owner migrates (dedupesvc migrate). Defaults to false:
	// Start migrates.
	SkipMigrations bool
	// MaxConns sizes the PostgreSQL connection pool (-db-max-conns).
	// Defaults to 16.
	MaxConns int
	// StoreMaxBatch is the most Begins and Finishes written in one
	// transaction by concurrent callers (-store-max-batch); 1 turns
	// batching off. Defaults to the store's: 64 on PostgreSQL, 128 embedded.
	StoreMaxBatch int
	// StoreWriters is how many group-commit transactions PostgreSQL writes
	// at once, at most half of MaxConns (-store-writers). Defaults to 2.
	StoreWriters int
	// SweepInterval is the pause between sweeps of expired records
	// (-sweep-interval). Defaults to 1m.
	SweepInterval time.Duration
	// SweepBatch is how many expired records one delete removes
	// (-sweep-batch). Defaults to 1000.
	SweepBatch int
	// UsageCompactionInterval is how often the quotas' usage takes in the
	// latest changes on PostgreSQL (-usage-compaction-interval); a caller
	// may overshoot a quota by what it reserves in this long. At least
	// 10ms. Defaults to 1s.
	UsageCompactionInterval time.Duration
	// DisableNotify makes waiting duplicates only poll, without
	// LISTEN/NOTIFY (-notify=false): for a PostgreSQL without NOTIFY
	// (CockroachDB) or a pooler that drops LISTEN. Defaults to false.
	DisableNotify bool
	// PollInterval is how often a waiting duplicate re-reads its record
	// (-poll-interval). Defaults to 200ms.
	PollInterval time.Duration
	// UnknownRetention is how long an unresolved outcome-unknown record
	// blocks its key (-unknown-retention). Defaults to 168h.
	UnknownRetention time.Duration
	// MaxOutcomeBytes is the largest outcome stored (-max-outcome-bytes).
	// Defaults to 1048576.
	MaxOutcomeBytes int
	// CallerBeginRate is the Begins a second the process may make
	// (-caller-begin-rate); Unlimited turns the limit off. Defaults to
	// 10000.
	CallerBeginRate float64
	// CallerBeginBurst is the Begins it may make at once above that rate
	// (-caller-begin-burst). Defaults to 10000.
	CallerBeginBurst int
	// CallerOutcomeByteRate is the outcome bytes a second its Finishes may
	// carry (-caller-outcome-byte-rate); Unlimited turns the limit off.
	// Defaults to 33554432 (32 MiB).
	CallerOutcomeByteRate float64
	// CallerOutcomeByteBurst is the outcome bytes its Finishes may carry at
	// once above that rate, raised to MaxOutcomeBytes when lower
	// (-caller-outcome-byte-burst). Defaults to 33554432.
	CallerOutcomeByteBurst int
	// MaxFinishBytesInFlight bounds the outcome bytes its Finishes hold in
	// the service at once (-max-finish-bytes-in-flight). Defaults to
	// 33554432.
	MaxFinishBytesInFlight int
	// CallerMaxRecords is the records it may keep stored
	// (-caller-max-records); Unlimited turns the limit off. Defaults to
	// 1000000.
	CallerMaxRecords int64
	// CallerMaxBytes is the outcome bytes it may keep stored
	// (-caller-max-bytes); Unlimited turns the limit off. Defaults to
	// 1073741824 (1 GiB).
	CallerMaxBytes int64
	// MaxRetention is the longest retention a Begin may ask for
	// (-max-retention). Defaults to 168h.
	MaxRetention time.Duration
	// MaxWaiters bounds the Begins waiting for in-flight outcomes at once
	// (-max-waiters); past it they answer in_flight at once. Defaults to
	// 10000.
	MaxWaiters int
	// CallerMaxWaiters is how many of those one caller may have
	// (-caller-max-waiters). Defaults to 1000.
	CallerMaxWaiters int
	// ReplayFlushInterval is how often replay counts are added to the
	// stored records (-replay-flush-interval); Close flushes the rest.
	// Defaults to 1s.
	ReplayFlushInterval time.Duration
	// OutcomeKeysFile turns on encryption of stored outcomes
	// (-outcome-keys-file): one "id base64-32-bytes" key a line, the last
	// sealing, readable by this process's user only; reloaded on SIGHUP.
	// Defaults to empty: outcomes stored as received.
	OutcomeKeysFile string
	// OutcomeAcceptPlaintext replays stored outcomes that are not encrypted
	// when OutcomeKeysFile is set (-outcome-accept-plaintext). Defaults to
	// false.
	OutcomeAcceptPlaintext bool

	// MetricsListen serves the service's metrics, with the Go runtime's
	// and the process's, at http://MetricsListen/metrics
	// (-metrics-listen). Defaults to empty, none: unlike dedupesvc's
	// 127.0.0.1:9464, a library opens no port unasked. Use Registerer to
	// add them to the tool server's own /metrics instead.
	MetricsListen string
	// Registerer, when set, gets the service's own metrics
	// (idemgate_dedupe_*, idemgate_db_pool_*, the outcome-unknown records
	// gauge; not the Go runtime's or the process's), unregistered by
	// Close. Defaults to nil: none.
	Registerer prometheus.Registerer
	// Logger receives the service's logs (the store it opened, migrations,
	// sweeps, failures). Defaults to slog.Default() (dedupesvc's
	// -log-level has no field: set the handler's level).
	Logger *slog.Logger
}

// fields names each Config field by the dedupesvc flag it is, for errors.
var fields = map[string]string{
	"database-url": "DatabaseURL", "data-dir": "DataDir", "migrate-on-start": "SkipMigrations", "db-max-conns": "MaxConns",
	"store-max-batch": "StoreMaxBatch", "store-writers": "StoreWriters", "sweep-interval": "SweepInterval", "sweep-batch": "SweepBatch",
	"usage-compaction-interval": "UsageCompactionInterval", "notify": "DisableNotify", "poll-interval": "PollInterval",
	"unknown-retention": "UnknownRetention", "max-outcome-bytes": "MaxOutcomeBytes", "caller-begin-rate": "CallerBeginRate",
	"caller-begin-burst": "CallerBeginBurst", "caller-outcome-byte-rate": "CallerOutcomeByteRate",
	"caller-outcome-byte-burst": "CallerOutcomeByteBurst", "max-finish-bytes-in-flight": "MaxFinishBytesInFlight",
	"caller-max-records": "CallerMaxRecords", "caller-max-bytes": "CallerMaxBytes", "max-retention": "MaxRetention",
	"max-waiters": "MaxWaiters", "caller-max-waiters": "CallerMaxWaiters", "replay-flush-interval": "ReplayFlushInterval",
	"outcome-keys-file": "OutcomeKeysFile", "outcome-accept-plaintext": "OutcomeAcceptPlaintext", "metrics-listen": "MetricsListen",
}

// fieldName names the setting of a dedupesvc flag as a Config field; a
// flag with no field (none can be set through a Config) keeps its name.
func fieldName(flag string) string {
	if f, ok := fields[flag]; ok {
		return "embedded.Config." + f
	}
	return "-" + flag
}

// limit maps a Config limit to its flag's value: 0 the default, Unlimited
// (any negative) the flag's 0.
func limit[T int64 | float64](v, def T) T {
	switch {
	case v < 0:
		return 0
	case v == 0:
		return def
	}
	return v
}

// orDefault is v, or def when v is zero.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// app is the dedupesvc configuration c stands for.
func (c Config) app() dedupeapp.Config {
	d := dedupeapp.Defaults(os.Getenv)
	a := d
	a.DatabaseURL = c.DatabaseURL
	a.DataDir = c.DataDir
	a.MigrateOnStart = !c.SkipMigrations
	a.MaxConns = orDefault(c.MaxConns, d.MaxConns)
	a.StoreMaxBatch = orDefault(c.StoreMaxBatch, d.StoreMaxBatch)
	a.StoreWriters = orDefault(c.StoreWriters, d.StoreWriters)
	a.SweepInterval = orDefault(c.SweepInterval, d.SweepInterval)
	a.SweepBatch = orDefault(c.SweepBatch, d.SweepBatch)
	a.UsageCompactionInterval = orDefault(c.UsageCompactionInterval, d.UsageCompactionInterval)
	a.Notify = !c.DisableNotify
	a.PollInterval = orDefault(c.PollInterval, d.PollInterval)
	a.UnknownRetention = orDefault(c.UnknownRetention, d.UnknownRetention)
	a.MaxOutcomeBytes = orDefault(c.MaxOutcomeBytes, d.MaxOutcomeBytes)
	a.CallerBeginRate = limit(c.CallerBeginRate, d.CallerBeginRate)
	a.CallerBeginBurst = orDefault(c.CallerBeginBurst, d.CallerBeginBurst)
	a.CallerOutcomeByteRate = limit(c.CallerOutcomeByteRate, d.CallerOutcomeByteRate)
	a.CallerOutcomeByteBurst = orDefault(c.CallerOutcomeByteBurst, d.CallerOutcomeByteBurst)
	a.MaxFinishBytesInFlight = orDefault(c.MaxFinishBytesInFlight, d.MaxFinishBytesInFlight)
	a.CallerMaxRecords = limit(c.CallerMaxRecords, d.CallerMaxRecords)
	a.CallerMaxBytes = limit(c.CallerMaxBytes, d.CallerMaxBytes)
	a.MaxRetention = orDefault(c.MaxRetention, d.MaxRetention)
	a.MaxWaiters = orDefault(c.MaxWaiters, d.MaxWaiters)
	a.CallerMaxWaiters = orDefault(c.CallerMaxWaiters, d.CallerMaxWaiters)
	a.ReplayFlushInterval = orDefault(c.ReplayFlushInterval, d.ReplayFlushInterval)
	a.OutcomeKeysFile = c.OutcomeKeysFile
	a.OutcomeAcceptPlaintext = c.OutcomeAcceptPlaintext
	a.MetricsListen = c.MetricsListen
	return a.WithNames(fieldName)
}

// fromApp is the Config of a dedupesvc configuration, which CheckEmbeddable
// has found to set no server-only field.
func fromApp(a dedupeapp.Config) Config {
	unlimited := func(v float64) float64 {
		if v == 0 {
			return Unlimited
		}
		return v
	}
	unlimitedInt := func(v int64) int64 {
		if v == 0 {
			return Unlimited
		}
		return v
	}
	dataDir := a.DataDir
	if a.DatabaseURL != "" {
		dataDir = "" // -data-dir's default, unused with a database
	}
	return Config{
		DatabaseURL: a.DatabaseURL, DataDir: dataDir, SkipMigrations: !a.MigrateOnStart, MaxConns: a.MaxConns,
		StoreMaxBatch: a.StoreMaxBatch, StoreWriters: a.StoreWriters, SweepInterval: a.SweepInterval, SweepBatch: a.SweepBatch,
		UsageCompactionInterval: a.UsageCompactionInterval, DisableNotify: !a.Notify, PollInterval: a.PollInterval,
		UnknownRetention: a.UnknownRetention, MaxOutcomeBytes: a.MaxOutcomeBytes,
		CallerBeginRate: unlimited(a.CallerBeginRate), CallerBeginBurst: a.CallerBeginBurst,
		CallerOutcomeByteRate: unlimited(a.CallerOutcomeByteRate), CallerOutcomeByteBurst: a.CallerOutcomeByteBurst,
		MaxFinishBytesInFlight: a.MaxFinishBytesInFlight,
		CallerMaxRecords:       unlimitedInt(a.CallerMaxRecords), CallerMaxBytes: unlimitedInt(a.CallerMaxBytes),
		MaxRetention: a.MaxRetention, MaxWaiters: a.MaxWaiters, CallerMaxWaiters: a.CallerMaxWaiters,
		ReplayFlushInterval: a.ReplayFlushInterval, OutcomeKeysFile: a.OutcomeKeysFile,
		OutcomeAcceptPlaintext: a.OutcomeAcceptPlaintext, MetricsListen: a.MetricsListen,
	}
}

// Validate reports what Start would refuse in c, each setting named by its
// field (embedded.Config.SweepInterval): a Config that selects no store or
// two among them.
func (c Config) Validate() error {
	var store error
	switch {
	case c.DatabaseURL == "" && c.DataDir == "":
		store = errors.New("no store: set embedded.Config.DatabaseURL (PostgreSQL) or embedded.Config.DataDir (a directory of this process's own for the embedded store)")
	case c.DatabaseURL != "" && c.DataDir != "":
		store = errors.New("embedded.Config.DatabaseURL and embedded.Config.DataDir are both set: DataDir is the embedded store's, unused with a database; set one")
	}
	return errors.Join(store, c.app().ValidateNamed(fieldName))
}

// ParseFlags reads dedupesvc's flags in args (without a program name) and
// their environment variables through lookupEnv, os.LookupEnv in a command
// (DATABASE_URL, IDEMGATE_SWEEP_INTERVAL, ...; the flag wins; a variable set
// to the empty string is its flag given empty, as dedupesvc reads it) into
// a Config, with the
// command's defaults, -metrics-listen's 127.0.0.1:9464 included: for a
// tool server that passes dedupesvc flags through (payments-server -dedupe
// in-process -- flags). The Config's Logger writes text to standard error
// at -log-level. -h prints the flags to usage and returns flag.ErrHelp;
// name heads that usage. The flags of dedupesvc's gRPC server (-tls-*,
// -token-file, -reflection, ...) are refused by name: an embedded service
// has no caller to authenticate or trace but its own process; its
// connection limits and -listen are accepted and ignored.
func ParseFlags(name string, args []string, lookupEnv func(string) (string, bool), usage io.Writer) (Config, error) {
	a, err := dedupeapp.ParseConfig(name, args, lookupEnv, usage)
	if err != nil {
		return Config{}, err
	}
	if err := dedupeapp.CheckEmbeddable(a, func(flag string) string { return "-" + flag }); err != nil {
		return Config{}, err
	}
	c := fromApp(a)
	c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: a.LogLevel}))
	return c, nil
}

// Service is a Dedupe service running in this process, from Start until
// Close.
type Service struct {
	app        *dedupeapp.Embedded
	registerer prometheus.Registerer
	closeOnce  sync.Once
}

// Start opens the store cfg selects (connecting to PostgreSQL and applying
// its migrations, or opening the embedded store), starts the service's
// background work, and returns the running service. ctx bounds the start
// only: the service runs until Close, whatever becomes of ctx. A cfg that
// does not validate is refused with every error, each naming its field; a
// MetricsListen another socket listens on is refused before the store
// opens, not after its migrations.
func Start(ctx context.Context, cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	app, err := dedupeapp.Embed(ctx, cfg.app(), logger)
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	s := &Service{app: app}
	if cfg.Registerer != nil {
		var registered []prometheus.Collector
		for _, c := range app.Collectors() {
			if err := cfg.Registerer.Register(c); err != nil {
				for _, r := range registered {
					cfg.Registerer.Unregister(r)
				}
				app.Close()
				return nil, fmt.Errorf("embedded: embedded.Config.Registerer: %w", err)
			}
			registered = append(registered, c)
		}
		s.registerer = cfg.Registerer
	}
	return s, nil
}

// Client returns the client a gate calls the service through
// (interceptor.New, httpgate, connectgate, mcpgate): each call runs the
// service's method in this process (dedupesvc.NewInProcessClient), without
// authentication, so the records are in the empty namespace and the
// caller limits hold for the whole process. A call after Close fails
// UNAVAILABLE: its store is closed.
func (s *Service) Client() idemgatev1.DedupeServiceClient { return s.app.Client() }

// Close stops the service; call it after the gates' Close, whose last
// Finishes it stores. It stores the replay counts not yet flushed (for at
// most 5s; past that they are dropped, with a warning), stops the
// background work and waits for every goroutine of it to return (a sweep
// or a compaction under way ends with its statement), closes the store
// (the PostgreSQL pool's connections, or the SQLite file), stops
// MetricsListen and unregisters the metrics from Registerer. It returns
// once all of that is done; later calls return at once.
func (s *Service) Close() {
	s.closeOnce.Do(func() {
		if s.registerer != nil {
			for _, c := range s.app.Collectors() {
				s.registerer.Unregister(c)
			}
		}
		s.app.Close()
	})
}

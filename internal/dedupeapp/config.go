// Package dedupeapp is the dedupesvc binary minus main: configuration from
// flags and environment, the gRPC server with health and logging, migrations
// on start, the sweeper, and graceful shutdown. Embed runs the same service
// inside another process, without the gRPC server (payments-server -dedupe
// in-process).
package dedupeapp

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/loopback"
	"github.com/idemgate/idemgate/internal/version"
)

// Config is the dedupesvc configuration. Every field has a flag and an
// environment variable; the flag wins.
type Config struct {
	// Listen is the gRPC listen address. Defaults to 127.0.0.1:50051
	// (IDEMGATE_LISTEN).
	Listen string
	// DatabaseURL is the PostgreSQL connection URL. Empty selects the
	// embedded SQLite store in DataDir. Defaults to empty (DATABASE_URL).
	DatabaseURL string
	// DataDir holds the embedded store's file when DatabaseURL is empty.
	// Defaults to $XDG_DATA_HOME/idemgate, else ~/.local/share/idemgate
	// (IDEMGATE_DATA_DIR).
	DataDir string
	// MigrateOnStart applies pending migrations before serving. Defaults to
	// true (IDEMGATE_MIGRATE_ON_START).
	MigrateOnStart bool
	// MaxConns sizes the database connection pool; 0 takes DefaultDBMaxConns.
	// Defaults to DefaultDBMaxConns, 16 (IDEMGATE_DB_MAX_CONNS).
	MaxConns int
	// StoreMaxBatch is the most Begins and Finishes the store writes in one
	// transaction (group commit, pgstore.GroupCommit and
	// sqlitestore.GroupCommit); 1 turns batching off, 0 takes the store's
	// default (64 on PostgreSQL, 128 on the embedded store). Defaults to 0
	// (IDEMGATE_STORE_MAX_BATCH).
	StoreMaxBatch int
	// StoreWriters is how many group-commit transactions PostgreSQL writes
	// at once (pgstore.GroupCommit.Writers), at most half the pool; 0 takes
	// pgstore.DefaultGroupCommit's 2. Fewer writers make bigger batches and
	// fewer commits: on the 2-core machine of BENCHMARKS.md 2 writers did
	// 1.5x the Begin+Finish pairs of 8 at 16 callers. Raise it for a
	// database with more cores. Defaults to 0 (IDEMGATE_STORE_WRITERS).
	StoreWriters int
	// SweepInterval is the pause between sweeps of expired records. Defaults
	// to 1m (IDEMGATE_SWEEP_INTERVAL).
	SweepInterval time.Duration
	// UsageCompactionInterval is how often the quotas' usage totals take in
	// the store's latest changes (dedupesvc.RunUsageCompaction; PostgreSQL
	// only): a caller may overshoot a quota by what it reserves in this
	// long. 0 takes dedupesvc.DefaultUsageCompactionInterval. Defaults to 1s
	// (IDEMGATE_USAGE_COMPACTION_INTERVAL).
	UsageCompactionInterval time.Duration
	// SweepBatch is how many expired records one delete removes. Defaults to
	// 1000 (IDEMGATE_SWEEP_BATCH).
	SweepBatch int
	// ShutdownTimeout bounds the graceful stop on SIGTERM: in-flight calls
	// get this long to finish. Defaults to 10s (IDEMGATE_SHUTDOWN_TIMEOUT).
	ShutdownTimeout time.Duration
	// LogLevel is debug, info, warn or error. Defaults to info
	// (IDEMGATE_LOG_LEVEL).
	LogLevel slog.Level
	// Notify announces record changes with NOTIFY and listens for them, so a
	// waiting duplicate wakes at once; off, waiters only poll (CockroachDB has
	// no NOTIFY). Defaults to true (IDEMGATE_NOTIFY).
	Notify bool
	// ListenDatabaseURL is where the NOTIFY listener connects when it must
	// not go where DatabaseURL goes: a direct PostgreSQL URL when
	// DatabaseURL is a PgBouncer in transaction pooling mode, through which
	// no notification arrives (docs/operating.md). Empty connects like the
	// pool. Defaults to empty (IDEMGATE_LISTEN_DATABASE_URL).
	ListenDatabaseURL string
	// GrantRuntimeRole, for the migrate command only, names a role to grant
	// what the service needs at run time once the migrations are applied
	// (pgstore.GrantRuntimeRole): the service can then run as that role,
	// which may not change the schema. Defaults to empty
	// (IDEMGATE_GRANT_RUNTIME_ROLE).
	GrantRuntimeRole string
	// PollInterval is how often a waiting duplicate re-reads its record.
	// Defaults to 200ms (IDEMGATE_POLL_INTERVAL).
	PollInterval time.Duration
	// UnknownRetention is how long an outcome-unknown record blocks its key
	// when nobody resolves it; then it is deleted with a warning. Defaults to
	// 168h (IDEMGATE_UNKNOWN_RETENTION).
	UnknownRetention time.Duration
	// MaxOutcomeBytes is the largest outcome Finish and Resolve accept.
	// Defaults to 1048576 (IDEMGATE_MAX_OUTCOME_BYTES).
	MaxOutcomeBytes int
	// CallerBeginRate is each caller's Begins per second; 0 (also in a
	// Config built in Go) is no limit, as for the other caller limits.
	// Defaults to 10000 (IDEMGATE_CALLER_BEGIN_RATE).
	CallerBeginRate float64
	// CallerBeginBurst is each caller's Begin burst. Defaults to 10000
	// (IDEMGATE_CALLER_BEGIN_BURST).
	CallerBeginBurst int
	// CallerOutcomeByteRate is the outcome bytes each caller's Finishes may
	// carry a second; 0 (also in a Config built in Go) is no limit.
	// Defaults to 33554432, 32 MiB (IDEMGATE_CALLER_OUTCOME_BYTE_RATE).
	CallerOutcomeByteRate float64
	// CallerOutcomeByteBurst is each caller's outcome byte burst, raised to
	// MaxOutcomeBytes when lower. Defaults to 33554432
	// (IDEMGATE_CALLER_OUTCOME_BYTE_BURST).
	CallerOutcomeByteBurst int
	// MaxFinishBytesInFlight bounds the outcome bytes one caller's
	// Finishes hold in the service at once, each counted as it arrives at
	// the size its gate declares, or at MaxOutcomeBytes; past it a Finish
	// is refused from its headers, before its message is read
	// (dedupesvc.WithMaxFinishBytesInFlight). Raised to MaxOutcomeBytes
	// when lower; 0 (also in a Config built in Go) is the default, 33554432,
	// 32 MiB (IDEMGATE_MAX_FINISH_BYTES_IN_FLIGHT).
	MaxFinishBytesInFlight int
	// CallerMaxRecords is each caller's stored records; 0 is no limit.
	// Defaults to 1000000 (IDEMGATE_CALLER_MAX_RECORDS).
	CallerMaxRecords int64
	// CallerMaxBytes is each caller's stored outcome bytes; 0 is no limit.
	// Defaults to 1073741824 (IDEMGATE_CALLER_MAX_BYTES).
	CallerMaxBytes int64
	// MaxRetention is the longest retention a Begin may ask for; 0 takes the
	// default. Defaults to 168h (IDEMGATE_MAX_RETENTION).
	MaxRetention time.Duration
	// MaxWaiters and CallerMaxWaiters cap the Begins waiting for in-flight
	// outcomes, in all and per caller; 0 takes the default. Default to
	// 10000 and 1000 (IDEMGATE_MAX_WAITERS, IDEMGATE_CALLER_MAX_WAITERS).
	MaxWaiters, CallerMaxWaiters int
	// MaxConcurrentBegins bounds the Begins at PostgreSQL at once, so a crowd
	// of them (every caller back after an outage) cannot take the
	// connections the running calls renew and finish on
	// (dedupesvc.WithMaxConcurrentBegins); 0 takes three quarters of
	// MaxConns. Defaults to 0 (IDEMGATE_MAX_CONCURRENT_BEGINS).
	MaxConcurrentBegins int
	// ConsoleListen is the HTTP address of the operator console
	// (internal/console): pages over the admin API for the on-call
	// engineer, signed in with an admin token from TokenFile or an admin
	// client certificate (AdminIdentities over TLSClientCA). Off a loopback
	// address it is served only over TLS (TLSCert, TLSKey; InsecurePlaintext
	// does not apply: the console carries admin tokens and session
	// cookies). Defaults to empty: off (IDEMGATE_CONSOLE_LISTEN).
	ConsoleListen string
	// ConsoleDescriptors is a file holding a serialized
	// google.protobuf.FileDescriptorSet (buf build -o set.binpb, or protoc
	// --descriptor_set_out --include_imports) with the gated tool servers'
	// services: with it the console decodes their stored outcomes to JSON
	// and completes outcome-unknown records with an outcome given as JSON.
	// Read at start, which fails if it is unreadable or not a set; it needs
	// ConsoleListen. Defaults to empty: none (IDEMGATE_CONSOLE_DESCRIPTORS).
	ConsoleDescriptors string
	// MetricsListen is the HTTP address serving Prometheus metrics at
	// /metrics; empty turns it off. Defaults to 127.0.0.1:9464
	// (IDEMGATE_METRICS_LISTEN).
	MetricsListen string
	// TLSCert and TLSKey are the server's certificate and key files; empty
	// serves plaintext, which only a loopback address (or InsecurePlaintext)
	// allows. Reread when they change, for new connections (tlsfiles).
	// Default to empty (IDEMGATE_TLS_CERT, IDEMGATE_TLS_KEY).
	TLSCert, TLSKey string
	// TLSClientCA is a PEM file of the CAs whose client certificates are
	// accepted (mutual TLS); a caller is named by its certificate's SPIFFE
	// ID, else its subject. Reread when it changes, for new connections.
	// Defaults to empty (IDEMGATE_TLS_CLIENT_CA).
	TLSClientCA string
	// TokenFile lists accepted bearer tokens, one "name client|admin secret"
	// a line. Defaults to empty (IDEMGATE_TOKEN_FILE).
	TokenFile string
	// OutcomeKeysFile turns on encryption of stored outcomes: one key a
	// line, "id base64(32 bytes)"; the last line's key seals new outcomes,
	// the others only open older ones (dedupesvc.ReadOutcomeKeys). It must
	// be readable by the service's user only. Reloaded on SIGHUP. Defaults
	// to empty: outcomes are stored as received (IDEMGATE_OUTCOME_KEYS_FILE).
	OutcomeKeysFile string
	// OutcomeAcceptPlaintext makes a service with OutcomeKeysFile replay
	// stored outcomes that are not encrypted (written before encryption
	// was turned on); off, they answer DEDUPE_OUTCOME_UNREADABLE. Defaults
	// to false (IDEMGATE_OUTCOME_ACCEPT_PLAINTEXT).
	OutcomeAcceptPlaintext bool
	// AdminIdentities are the certificate identities allowed the admin RPCs.
	// Defaults to none (IDEMGATE_ADMIN_IDENTITIES, comma-separated).
	AdminIdentities []string
	// AgentForwarders are the caller identities (token names or certificate
	// identities: tool servers shared by several agents) whose forwarded end
	// caller, the tenant their gate sends in the idemgate-agent-bin header,
	// the service takes: their Begin rate (CallerBeginRate, CallerBeginBurst)
	// then applies per agent, so one agent over its rate does not refuse its
	// neighbours'. Records and their quotas stay the tool server's. Defaults
	// to none: every caller has one rate (IDEMGATE_AGENT_FORWARDERS,
	// comma-separated).
	AgentForwarders []string
	// InsecurePlaintext allows plaintext on an address that is not loopback.
	// Defaults to false (IDEMGATE_INSECURE_PLAINTEXT).
	InsecurePlaintext bool
	// Reflection registers the gRPC server reflection service, for grpcurl
	// and the like. Defaults to false (IDEMGATE_REFLECTION).
	Reflection bool
	// OTLPEndpoint turns OpenTelemetry tracing on, exporting spans over
	// OTLP/gRPC to https://host:port (TLS, system roots; SSL_CERT_FILE adds a
	// private CA), or http://host:port or a bare host:port (plaintext).
	// Defaults to empty: off (OTEL_EXPORTER_OTLP_ENDPOINT).
	OTLPEndpoint string
	// TracerProvider, when set, traces with it instead of an OTLP exporter
	// (for embedding and tests). Defaults to nil.
	TracerProvider trace.TracerProvider

	// MaxConnections bounds the connections served at once; further ones
	// wait in the kernel's accept queue until one closes. 0 takes the
	// default of 512 (IDEMGATE_MAX_CONNECTIONS).
	MaxConnections int
	// MaxConcurrentStreams bounds the calls (streams) open at once on one
	// connection; a client over it is refused the excess (REFUSED_STREAM;
	// grpc-go clients queue them). 0 takes the default of 256
	// (IDEMGATE_MAX_CONCURRENT_STREAMS).
	MaxConcurrentStreams int
	// HandshakeTimeout bounds a new connection's TLS handshake and HTTP/2
	// preface. 0 takes the default of 5s (IDEMGATE_HANDSHAKE_TIMEOUT).
	HandshakeTimeout time.Duration
	// MaxConnectionIdle closes a connection that has had no call for this
	// long. 0 takes the default of 5m (IDEMGATE_MAX_CONNECTION_IDLE).
	MaxConnectionIdle time.Duration
	// MaxConnectionAge closes any connection this old (±10% jitter), so
	// no connection is held for ever and load rebalances. 0 takes the
	// default of 30m (IDEMGATE_MAX_CONNECTION_AGE).
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace is what calls in flight on an aged connection
	// get to finish; above the longest Begin wait (1m). 0 takes the default
	// of 2m (IDEMGATE_MAX_CONNECTION_AGE_GRACE).
	MaxConnectionAgeGrace time.Duration
	// KeepaliveMinTime is the shortest interval between client pings the
	// service tolerates; a client pinging more often is disconnected
	// (GOAWAY ENHANCE_YOUR_CALM). 0 takes the default of 10s
	// (IDEMGATE_KEEPALIVE_MIN_TIME).
	KeepaliveMinTime time.Duration
	// MaxUnauthenticatedConnections bounds the connections open at once that
	// have not authenticated (no call yet with a valid bearer token or client
	// certificate); a new connection past it closes the oldest such
	// connection of the address holding the most, so strangers can never
	// fill MaxConnections and a tool server's new connection always gets
	// in. Only with authentication configured. 0 takes the default of 64;
	// more than half of MaxConnections is taken as half
	// (IDEMGATE_MAX_UNAUTHENTICATED_CONNECTIONS).
	MaxUnauthenticatedConnections int
	// MaxUnauthenticatedConnectionsPerIP bounds those per client IP
	// address, an IPv6 client's counted per /64 (one client holds a /64 at
	// least and can rotate addresses in it): a new one past it closes the
	// oldest of its address (or /64). 0 takes
	// the default of 8; more than MaxUnauthenticatedConnections is taken as
	// that (IDEMGATE_MAX_UNAUTHENTICATED_CONNECTIONS_PER_IP).
	MaxUnauthenticatedConnectionsPerIP int
	// MaxUnauthenticatedStreams bounds the calls open at once on a
	// connection that has not authenticated: health checks, the only calls
	// served without credentials (any other is refused from its headers,
	// before its message is read). The excess is refused
	// (RESOURCE_EXHAUSTED, DEDUPE_QUOTA_EXCEEDED, quota
	// unauthenticated_streams). Strangers' messages buffered before
	// authentication are at most MaxUnauthenticatedConnections x this x
	// the receive limit (MaxOutcomeBytes + 64 KiB). 0 takes the default of
	// 2 (IDEMGATE_MAX_UNAUTHENTICATED_STREAMS).
	MaxUnauthenticatedStreams int
	// UnauthenticatedTimeout closes a connection that has not authenticated
	// this long after it was accepted, whatever it is doing (health
	// watchers without credentials reconnect). 0 takes the default of 10s
	// (IDEMGATE_UNAUTHENTICATED_TIMEOUT).
	UnauthenticatedTimeout time.Duration
	// AuthRefusalLogRate is how many refused-authentication log lines a
	// second are written at most (bursts of 10); the rest are counted in the
	// next line and in idemgate_dedupe_auth_refusals_total. 0 takes the
	// default of 1 (IDEMGATE_AUTH_REFUSAL_LOG_RATE).
	AuthRefusalLogRate float64
	// TokenReloadInterval is how often the token file is checked for a
	// change (modification time or size) and reloaded; SIGHUP reloads it at
	// once. Negative turns polling off (SIGHUP only). 0 takes the default of
	// 5s (IDEMGATE_TOKEN_RELOAD_INTERVAL).
	TokenReloadInterval time.Duration
	// ReplayFlushInterval is how often replay counts, counted per record in
	// memory, are added to the store's records; counts not yet flushed are
	// lost when the process dies, and a flush is also made at shutdown. 0
	// takes the default. Defaults to 1s (IDEMGATE_REPLAY_FLUSH_INTERVAL).
	ReplayFlushInterval time.Duration
	// names, when set, names a setting in errors (see ValidateNamed and
	// WithNames); nil names its flag.
	names func(flag string) string

	// ResolveAdminOnly reserves DedupeService.Resolve to admin identities;
	// others get PERMISSION_DENIED (DEDUPE_PERMISSION_DENIED). Needs
	// authentication. Defaults to false: every caller may resolve its own
	// records (IDEMGATE_RESOLVE_ADMIN_ONLY).
	ResolveAdminOnly bool
}

// Defaults of the connection and logging limits, taken where a Config
// field is zero.
const (
	DefaultMaxConnections = 512
	// DefaultDBMaxConns is the database pool's size. pgxpool's own default,
	// max(4, CPUs), queues 64 concurrent callers behind 4 connections; 16
	// measured best of 4, 8, 16 and 32 with 64 callers on a 2-core machine
	// (BENCHMARKS.md, issue 12), and keeps three replicas well under
	// PostgreSQL's default max_connections of 100.
	DefaultDBMaxConns            = 16
	DefaultMaxConcurrentStreams  = 256
	DefaultHandshakeTimeout      = 5 * time.Second
	DefaultMaxConnectionIdle     = 5 * time.Minute
	DefaultMaxConnectionAge      = 30 * time.Minute
	DefaultMaxConnectionAgeGrace = 2 * time.Minute
	DefaultKeepaliveMinTime      = 10 * time.Second
	DefaultAuthRefusalLogRate    = 1.0
	// DefaultMaxUnauthenticatedConnections and the three after it bound
	// what callers that have not authenticated may hold (Config).
	DefaultMaxUnauthenticatedConnections      = 64
	DefaultMaxUnauthenticatedConnectionsPerIP = 8
	DefaultMaxUnauthenticatedStreams          = 2
	DefaultUnauthenticatedTimeout             = 10 * time.Second
	DefaultTokenReloadInterval                = 5 * time.Second
)

// withDefaults fills the zero limits with their defaults, so a Config built
// in code (tests, embedding) is as safe as one from flags.
func (c Config) withDefaults() Config {
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultDBMaxConns
	}
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.MaxConnectionIdle == 0 {
		c.MaxConnectionIdle = DefaultMaxConnectionIdle
	}
	if c.MaxConnectionAge == 0 {
		c.MaxConnectionAge = DefaultMaxConnectionAge
	}
	if c.MaxConnectionAgeGrace == 0 {
		c.MaxConnectionAgeGrace = DefaultMaxConnectionAgeGrace
	}
	if c.KeepaliveMinTime == 0 {
		c.KeepaliveMinTime = DefaultKeepaliveMinTime
	}
	// Clamped, also when set (the flag's default is set): strangers must
	// never hold the connection slots the callers that authenticate need.
	if c.MaxUnauthenticatedConnections == 0 {
		c.MaxUnauthenticatedConnections = DefaultMaxUnauthenticatedConnections
	}
	c.MaxUnauthenticatedConnections = max(1, min(c.MaxUnauthenticatedConnections, c.MaxConnections/2))
	if c.MaxUnauthenticatedConnectionsPerIP == 0 {
		c.MaxUnauthenticatedConnectionsPerIP = DefaultMaxUnauthenticatedConnectionsPerIP
	}
	c.MaxUnauthenticatedConnectionsPerIP = min(c.MaxUnauthenticatedConnectionsPerIP, c.MaxUnauthenticatedConnections)
	if c.MaxUnauthenticatedStreams == 0 {
		c.MaxUnauthenticatedStreams = DefaultMaxUnauthenticatedStreams
	}
	if c.UnauthenticatedTimeout == 0 {
		c.UnauthenticatedTimeout = DefaultUnauthenticatedTimeout
	}
	if c.AuthRefusalLogRate == 0 {
		c.AuthRefusalLogRate = DefaultAuthRefusalLogRate
	}
	if c.TokenReloadInterval == 0 {
		c.TokenReloadInterval = DefaultTokenReloadInterval
	}
	if c.ReplayFlushInterval == 0 {
		c.ReplayFlushInterval = dedupesvc.DefaultReplayFlushInterval
	}
	return c
}

// authConfigured reports whether callers must authenticate.
func (c Config) authConfigured() bool { return c.TLSClientCA != "" || c.TokenFile != "" }

// ParseConfig reads args (without the program name) and the environment
// through lookupEnv (os.LookupEnv: a variable set empty is its flag given empty, cliflag). It returns flag.ErrHelp after printing usage for -h, and an
// error for any argument that is not a flag, -version among them: its
// caller is a command that embeds the service and has its own -version.
func ParseConfig(name string, args []string, lookupEnv func(string) (string, bool), usage io.Writer) (Config, error) {
	cfg, words, err := ParseArgs(name, "", args, lookupEnv, usage)
	if errors.Is(err, version.ErrRequested) {
		return Config{}, fmt.Errorf("-version is not for %s: give it before the other flags, to the command itself", name)
	}
	if err == nil && len(words) > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q", words[0])
	}
	return cfg, err
}

// ParseArgs is ParseConfig for a binary with commands: flags may come before,
// between and after the command's words, which it returns in order.
// synopsis, printed by -h above the flags, lists the commands. It returns
// version.ErrRequested for -version, before reading the environment or
// checking any other flag.
func ParseArgs(name, synopsis string, args []string, lookupEnv func(string) (string, bool), usage io.Writer) (Config, []string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.Usage = func() {
		fmt.Fprintf(usage, "Usage of %s:\n%s\nFlags (each also read from the environment variable it names; the flag wins):\n", name, synopsis)
		fs.PrintDefaults()
	}
	var cfg Config
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:50051", "gRPC listen `address`")
	fs.StringVar(&cfg.DatabaseURL, "database-url", "", "PostgreSQL connection `URL`; empty uses the embedded SQLite store")
	fs.StringVar(&cfg.DataDir, "data-dir", defaultDataDir(lookupEnv), "`directory` of the embedded store, used when no database URL is set")
	fs.BoolVar(&cfg.MigrateOnStart, "migrate-on-start", true, "apply pending migrations before serving")
	fs.IntVar(&cfg.StoreWriters, "store-writers", 0, "group-commit transactions written at once on PostgreSQL, at most half of -db-max-conns; 0 takes the default, 2: fewer make bigger batches and fewer commits; raise it for a database with many cores")
	fs.IntVar(&cfg.StoreMaxBatch, "store-max-batch", 0, "most Begins and Finishes written in one transaction by concurrent callers (group commit); 1 turns batching off, 0 takes the store's default: 64 on PostgreSQL, 128 embedded")
	fs.IntVar(&cfg.MaxConns, "db-max-conns", DefaultDBMaxConns, "database pool `size`; watch idemgate_db_pool_empty_acquire_wait_seconds_total for callers queueing")
	fs.DurationVar(&cfg.UsageCompactionInterval, "usage-compaction-interval", dedupesvc.DefaultUsageCompactionInterval,
		"how often the quotas' usage takes in the latest changes on PostgreSQL; a caller may overshoot a quota by what it reserves in this long")
	fs.DurationVar(&cfg.SweepInterval, "sweep-interval", time.Minute, "pause between sweeps of expired records")
	fs.IntVar(&cfg.SweepBatch, "sweep-batch", 1000, "expired records deleted per statement")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "time in-flight calls get to finish on SIGTERM")
	fs.BoolVar(&cfg.Notify, "notify", true, "wake waiting duplicates with LISTEN/NOTIFY; off, they only poll")
	fs.StringVar(&cfg.ListenDatabaseURL, "listen-database-url", "", "PostgreSQL `URL` the NOTIFY listener connects to, when -database-url is a PgBouncer in transaction pooling mode (a direct URL); empty connects like -database-url")
	fs.StringVar(&cfg.GrantRuntimeRole, "grant-runtime-role", "", "migrate only: after migrating, grant `role` what the service needs at run time and nothing more (docs/operating.md)")
	fs.DurationVar(&cfg.PollInterval, "poll-interval", 200*time.Millisecond, "how often a waiting duplicate re-reads its record")
	fs.DurationVar(&cfg.UnknownRetention, "unknown-retention", 7*24*time.Hour, "how long an unresolved outcome-unknown record blocks its key")
	fs.IntVar(&cfg.MaxOutcomeBytes, "max-outcome-bytes", 1<<20, "largest stored outcome, in bytes")
	fs.Float64Var(&cfg.CallerBeginRate, "caller-begin-rate", dedupesvc.DefaultCallerRate, "Begins a second each caller may make; 0 is no limit")
	fs.IntVar(&cfg.CallerBeginBurst, "caller-begin-burst", dedupesvc.DefaultCallerBurst, "Begins each caller may make at once above its rate")
	fs.Float64Var(&cfg.CallerOutcomeByteRate, "caller-outcome-byte-rate", dedupesvc.DefaultCallerOutcomeRate, "outcome bytes a second each caller's Finishes may carry; 0 is no limit")
	fs.IntVar(&cfg.CallerOutcomeByteBurst, "caller-outcome-byte-burst", dedupesvc.DefaultCallerOutcomeBurst, "outcome bytes each caller's Finishes may carry at once above that rate (at least -max-outcome-bytes)")
	fs.IntVar(&cfg.MaxFinishBytesInFlight, "max-finish-bytes-in-flight", dedupesvc.DefaultMaxFinishBytesInFlight, "outcome bytes each caller's Finishes may hold in the service at once; past it they are refused before they are read")
	fs.Int64Var(&cfg.CallerMaxRecords, "caller-max-records", dedupesvc.DefaultCallerRecords, "records each caller may keep stored; 0 is no limit")
	fs.Int64Var(&cfg.CallerMaxBytes, "caller-max-bytes", dedupesvc.DefaultCallerBytes, "outcome bytes each caller may keep stored; 0 is no limit")
	fs.DurationVar(&cfg.MaxRetention, "max-retention", dedupesvc.DefaultMaxRetention, "longest retention a Begin may ask for; longer is refused")
	fs.IntVar(&cfg.MaxWaiters, "max-waiters", dedupesvc.DefaultMaxWaiters, "Begins that may wait for in-flight outcomes at once; past it they answer in_flight at once")
	fs.IntVar(&cfg.CallerMaxWaiters, "caller-max-waiters", dedupesvc.DefaultMaxCallerWaiters, "of those, how many one caller may have")
	fs.IntVar(&cfg.MaxConcurrentBegins, "max-concurrent-begins", 0, "Begins at PostgreSQL at once, so renewals and Finishes keep connections when callers crowd back; 0 takes three quarters of -db-max-conns")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", "127.0.0.1:9464", "HTTP `address` of the Prometheus /metrics endpoint; empty turns it off")
	fs.StringVar(&cfg.ConsoleListen, "console-listen", "", "HTTP `address` of the operator console (admin sign-in: an admin token of -token-file, or an -admin-identities client certificate); "+
		"TLS (-tls-cert) off loopback, -insecure-plaintext does not apply; empty turns it off")
	fs.StringVar(&cfg.ConsoleDescriptors, "console-descriptors", "", "`file` holding a FileDescriptorSet (buf build -o set.binpb) of the gated services: the console decodes their outcomes to JSON and completes "+
		"outcome-unknown records with JSON; empty: none")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "server certificate `file` (PEM), reread when it changes; empty serves plaintext, loopback only")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "server key `file` (PEM), reread when it changes")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", "", "CA `file` (PEM) of accepted client certificates: mutual TLS; reread when it changes")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "`file` of accepted bearer tokens, \"name client|admin secret\" per line")
	fs.StringVar(&cfg.OutcomeKeysFile, "outcome-keys-file", "", "`file` of keys that encrypt stored outcomes, \"id base64-32-bytes\" per line, the last one sealing; reloaded on SIGHUP; empty stores outcomes as received")
	fs.BoolVar(&cfg.OutcomeAcceptPlaintext, "outcome-accept-plaintext", false, "with -outcome-keys-file, also replay stored outcomes that are not encrypted (written before encryption was turned on); off, they answer DEDUPE_OUTCOME_UNREADABLE")
	admins := fs.String("admin-identities", "", "comma-separated certificate identities allowed the admin RPCs")
	forwarders := fs.String("agent-forwarders", "", "comma-separated caller identities (token names, certificate identities) whose forwarded agent gets its own Begin rate")
	fs.BoolVar(&cfg.InsecurePlaintext, "insecure-plaintext", false, "allow plaintext on an address that is not loopback")
	fs.BoolVar(&cfg.Reflection, "reflection", false, "serve gRPC server reflection")
	fs.StringVar(&cfg.OTLPEndpoint, "otlp-endpoint", "", "OpenTelemetry collector (OTLP/gRPC): `https://host:port` for TLS, http://host:port or host:port for plaintext; empty turns tracing off")
	fs.IntVar(&cfg.MaxConnections, "max-connections", DefaultMaxConnections, "connections served at once; more wait to be accepted")
	fs.IntVar(&cfg.MaxConcurrentStreams, "max-concurrent-streams", DefaultMaxConcurrentStreams, "calls open at once on one connection; the excess is refused")
	fs.DurationVar(&cfg.HandshakeTimeout, "handshake-timeout", DefaultHandshakeTimeout, "time a new connection gets for its TLS handshake and HTTP/2 preface")
	fs.DurationVar(&cfg.MaxConnectionIdle, "max-connection-idle", DefaultMaxConnectionIdle, "close a connection without calls for this long")
	fs.DurationVar(&cfg.MaxConnectionAge, "max-connection-age", DefaultMaxConnectionAge, "close any connection this old, ±10%")
	fs.DurationVar(&cfg.MaxConnectionAgeGrace, "max-connection-age-grace", DefaultMaxConnectionAgeGrace, "time calls on an aged connection get to finish")
	fs.DurationVar(&cfg.KeepaliveMinTime, "keepalive-min-time", DefaultKeepaliveMinTime, "shortest client ping interval tolerated; faster pingers are disconnected")
	fs.IntVar(&cfg.MaxUnauthenticatedConnections, "max-unauthenticated-connections", DefaultMaxUnauthenticatedConnections,
		"connections open at once that have not authenticated, at most half of -max-connections; past it the oldest of the address holding the most is closed")
	fs.IntVar(&cfg.MaxUnauthenticatedConnectionsPerIP, "max-unauthenticated-connections-per-ip", DefaultMaxUnauthenticatedConnectionsPerIP,
		"of those, how many one client IP address may have (IPv6 counted per /64, which one client can rotate addresses in); past it its oldest is closed")
	fs.IntVar(&cfg.MaxUnauthenticatedStreams, "max-unauthenticated-streams", DefaultMaxUnauthenticatedStreams,
		"health checks open at once on a connection that has not authenticated; the excess is refused (other calls need credentials, checked before their message is read)")
	fs.DurationVar(&cfg.UnauthenticatedTimeout, "unauthenticated-timeout", DefaultUnauthenticatedTimeout,
		"close a connection that has not authenticated this long after it was accepted")
	fs.Float64Var(&cfg.AuthRefusalLogRate, "auth-refusal-log-rate", DefaultAuthRefusalLogRate, "refused-authentication log lines per second, bursts of 10; all are counted")
	fs.DurationVar(&cfg.TokenReloadInterval, "token-reload-interval", DefaultTokenReloadInterval, "how often the token file is checked for changes; negative: on SIGHUP only")
	fs.BoolVar(&cfg.ResolveAdminOnly, "resolve-admin-only", false, "reserve DedupeService.Resolve to admin identities")
	fs.DurationVar(&cfg.ReplayFlushInterval, "replay-flush-interval", dedupesvc.DefaultReplayFlushInterval, "how often replay counts are added to the records, in one statement; unflushed counts die with the process")
	level := fs.String("log-level", "info", "log `level`: debug, info, warn or error")
	env := cliflag.Bind(fs, "IDEMGATE_", lookupEnv,
		cliflag.WithName("database-url", "DATABASE_URL"),
		cliflag.WithName("otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT"))
	showVersion := version.Flag(fs) // after Bind: no variable
	var words []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			return Config{}, nil, err
		}
		if rest = fs.Args(); len(rest) == 0 {
			break
		}
		words, rest = append(words, rest[0]), rest[1:]
	}
	if *showVersion {
		return Config{}, nil, version.ErrRequested
	}
	if err := env.Apply(); err != nil {
		return Config{}, nil, err
	}
	for _, id := range strings.Split(*admins, ",") {
		if id = strings.TrimSpace(id); id != "" {
			cfg.AdminIdentities = append(cfg.AdminIdentities, id)
		}
	}
	for _, id := range strings.Split(*forwarders, ",") {
		if id = strings.TrimSpace(id); id != "" {
			cfg.AgentForwarders = append(cfg.AgentForwarders, id)
		}
	}
	if err := cfg.LogLevel.UnmarshalText([]byte(strings.ToUpper(*level))); err != nil {
		return Config{}, nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", *level)
	}
	return cfg, words, cfg.validate()
}

// defaultDataDir follows the XDG base directory convention.
func defaultDataDir(lookupEnv func(string) (string, bool)) string {
	getenv := func(name string) string { v, _ := lookupEnv(name); return v }
	if d := getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "idemgate")
	}
	if home := getenv("HOME"); home != "" {
		return filepath.Join(home, ".local", "share", "idemgate")
	}
	return "idemgate-data"
}

func (c Config) validate() error { return c.ValidateNamed(flagName) }

// flagName is how the command's errors name a setting: by its flag.
func flagName(flag string) string { return "-" + flag }

// WithNames returns c naming its settings by name(flag) in the errors of
// opening its store, as ValidateNamed does in its checks.
func (c Config) WithNames(name func(flag string) string) Config {
	c.names = name
	return c
}

// name is how errors name the setting of flag (without its dash).
func (c Config) name(flag string) string {
	if c.names != nil {
		return c.names(flag)
	}
	return flagName(flag)
}

// nameEnv is name, followed by the environment variable env that also sets
// it when the setting is named by its flag.
func (c Config) nameEnv(flag, env string) string {
	if c.names != nil {
		return c.names(flag)
	}
	return flagName(flag) + " (" + env + ")"
}

// Defaults is the Config of the dedupesvc command run without flags and
// without its environment variables: every flag's default. The data
// directory's default reads only XDG_DATA_HOME and HOME through getenv.
func Defaults(getenv func(string) string) Config {
	cfg, err := ParseConfig("dedupesvc", nil, func(name string) (string, bool) {
		if name == "XDG_DATA_HOME" || name == "HOME" {
			v := getenv(name)
			return v, v != ""
		}
		return "", false
	}, io.Discard)
	if err != nil {
		panic("dedupeapp: the flags' defaults do not validate: " + err.Error())
	}
	return cfg
}

// ValidateNamed checks c as ParseConfig does, naming each setting in its
// errors by name(flag), flag being the setting's flag without its dash:
// the command names flags, a Go API its own fields.
func (c Config) ValidateNamed(n func(flag string) string) error {
	var errs []error
	if c.DatabaseURL == "" && c.DataDir == "" {
		errs = append(errs, errors.New("set "+n("database-url")+" (DATABASE_URL) for PostgreSQL, or "+n("data-dir")+" (IDEMGATE_DATA_DIR) for the embedded store"))
	}
	if c.Listen == "" {
		errs = append(errs, errors.New(n("listen")+" must not be empty"))
	}
	if c.ListenDatabaseURL != "" {
		if c.DatabaseURL == "" {
			errs = append(errs, errors.New("-listen-database-url needs -database-url: the embedded store has no NOTIFY"))
		} else if _, err := pgx.ParseConfig(c.ListenDatabaseURL); err != nil {
			errs = append(errs, fmt.Errorf("-listen-database-url: not a PostgreSQL URL: %w", err))
		}
	}
	if c.MaxConns < 0 {
		errs = append(errs, fmt.Errorf(n("db-max-conns")+" must be 0 or more, got %d", c.MaxConns))
	}
	if c.StoreWriters < 0 {
		errs = append(errs, fmt.Errorf(n("store-writers")+" must be 0 or more, got %d", c.StoreWriters))
	}
	if c.StoreMaxBatch < 0 {
		errs = append(errs, fmt.Errorf(n("store-max-batch")+" must be 0 or more, got %d", c.StoreMaxBatch))
	}
	if c.UsageCompactionInterval != 0 && c.UsageCompactionInterval < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf(n("usage-compaction-interval")+" must be 10ms or more, got %s", c.UsageCompactionInterval))
	}
	if c.SweepInterval <= 0 {
		errs = append(errs, fmt.Errorf(n("sweep-interval")+" must be positive, got %s", c.SweepInterval))
	}
	if c.SweepBatch <= 0 {
		errs = append(errs, fmt.Errorf(n("sweep-batch")+" must be positive, got %d", c.SweepBatch))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New(n("tls-cert")+" and "+n("tls-key")+" go together"))
	}
	if c.TLSClientCA != "" && c.TLSCert == "" {
		errs = append(errs, errors.New(n("tls-client-ca")+" needs "+n("tls-cert")+" and "+n("tls-key")+": client certificates travel over TLS"))
	}
	if !loopback.Address(c.Listen) {
		if c.TLSCert == "" && !c.InsecurePlaintext {
			errs = append(errs, fmt.Errorf(n("listen")+" %s is not a loopback address: serve TLS ("+n("tls-cert")+", "+n("tls-key")+") or set "+n("insecure-plaintext"), c.Listen))
		}
		if !c.authConfigured() {
			errs = append(errs, fmt.Errorf(n("listen")+" %s is not a loopback address: configure "+n("tls-client-ca")+" or "+n("token-file")+" so callers authenticate", c.Listen))
		}
	}
	if c.ConsoleDescriptors != "" && c.ConsoleListen == "" {
		errs = append(errs, errors.New(n("console-descriptors")+" is for the console, which is off: set "+n("console-listen")+" too, or drop it"))
	}
	if c.ConsoleListen != "" {
		if !loopback.Address(c.ConsoleListen) && c.TLSCert == "" {
			errs = append(errs, fmt.Errorf(n("console-listen")+" %s is not a loopback address: serve the console over TLS ("+n("tls-cert")+", "+n("tls-key")+
				"); "+n("insecure-plaintext")+" does not apply to it, as admin tokens and session cookies would cross the network readable", c.ConsoleListen))
		}
		if c.ConsoleListen == c.Listen || c.ConsoleListen == c.MetricsListen {
			errs = append(errs, fmt.Errorf(n("console-listen")+" %s is also the gRPC or metrics address: give the console an address of its own", c.ConsoleListen))
		}
		if c.TokenFile == "" && (len(c.AdminIdentities) == 0 || c.TLSClientCA == "") {
			errs = append(errs, errors.New(n("console-listen")+" needs a way for operators to sign in: "+n("token-file")+" with an admin token, or "+
				n("admin-identities")+" with "+n("tls-client-ca")+" (client certificates)"))
		}
	}
	if _, err := otlpExporterOptions(c.OTLPEndpoint); err != nil {
		errs = append(errs, err)
	}
	if c.MaxFinishBytesInFlight < 0 {
		errs = append(errs, fmt.Errorf(n("max-finish-bytes-in-flight")+" must not be negative, got %d", c.MaxFinishBytesInFlight))
	}
	if c.CallerOutcomeByteRate < 0 || c.CallerOutcomeByteBurst < 0 {
		errs = append(errs, errors.New(n("caller-outcome-byte-rate")+" and "+n("caller-outcome-byte-burst")+" must be 0 (no limit) or more"))
	}
	if c.CallerBeginRate < 0 || c.CallerMaxRecords < 0 || c.CallerMaxBytes < 0 {
		errs = append(errs, errors.New(n("caller-begin-rate")+", "+n("caller-max-records")+" and "+n("caller-max-bytes")+" must be 0 (no limit) or more"))
	}
	if c.CallerBeginRate > 0 && c.CallerBeginBurst < 1 {
		errs = append(errs, fmt.Errorf(n("caller-begin-burst")+" must be 1 or more, got %d", c.CallerBeginBurst))
	}
	if c.MaxConcurrentBegins < 0 {
		errs = append(errs, fmt.Errorf(n("max-concurrent-begins")+" must be 0 (three quarters of the pool) or more, got %d", c.MaxConcurrentBegins))
	}
	if c.MaxWaiters < 0 || c.CallerMaxWaiters < 0 {
		errs = append(errs, errors.New(n("max-waiters")+" and "+n("caller-max-waiters")+" must be positive"))
	}
	if c.MaxRetention < 0 || c.MaxRetention > dedupesvc.MaxRetention {
		errs = append(errs, fmt.Errorf(n("max-retention")+" must be between 0 and %s, got %s", dedupesvc.MaxRetention, c.MaxRetention))
	}
	if c.MaxOutcomeBytes <= 0 {
		errs = append(errs, fmt.Errorf(n("max-outcome-bytes")+" must be positive, got %d", c.MaxOutcomeBytes))
	}
	if c.PollInterval <= 0 {
		errs = append(errs, fmt.Errorf(n("poll-interval")+" must be positive, got %s", c.PollInterval))
	}
	if c.UnknownRetention <= 0 {
		errs = append(errs, fmt.Errorf(n("unknown-retention")+" must be positive, got %s", c.UnknownRetention))
	}
	if len(c.AgentForwarders) > 0 && !c.authConfigured() {
		errs = append(errs, errors.New(n("agent-forwarders")+" needs "+n("tls-client-ca")+" or "+n("token-file")+": without authentication no caller is a forwarder"))
	}
	if c.ResolveAdminOnly && !c.authConfigured() {
		errs = append(errs, errors.New(n("resolve-admin-only")+" needs "+n("tls-client-ca")+" or "+n("token-file")+": without authentication no caller is an admin"))
	}
	for _, limit := range []struct {
		flag string
		v    int
	}{{n("max-connections"), c.MaxConnections}, {n("max-concurrent-streams"), c.MaxConcurrentStreams},
		{n("max-unauthenticated-connections"), c.MaxUnauthenticatedConnections}, {n("max-unauthenticated-connections-per-ip"), c.MaxUnauthenticatedConnectionsPerIP},
		{n("max-unauthenticated-streams"), c.MaxUnauthenticatedStreams}} {
		if limit.v < 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %d", limit.flag, limit.v))
		}
	}
	for _, limit := range []struct {
		flag string
		v    time.Duration
	}{{n("handshake-timeout"), c.HandshakeTimeout}, {n("max-connection-idle"), c.MaxConnectionIdle}, {n("max-connection-age"), c.MaxConnectionAge},
		{n("max-connection-age-grace"), c.MaxConnectionAgeGrace}, {n("keepalive-min-time"), c.KeepaliveMinTime},
		{n("unauthenticated-timeout"), c.UnauthenticatedTimeout}} {
		if limit.v < 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", limit.flag, limit.v))
		}
	}
	if c.AuthRefusalLogRate < 0 {
		errs = append(errs, fmt.Errorf(n("auth-refusal-log-rate")+" must be positive, got %g", c.AuthRefusalLogRate))
	}
	if c.ReplayFlushInterval < 0 {
		errs = append(errs, fmt.Errorf(n("replay-flush-interval")+" must be positive, got %s", c.ReplayFlushInterval))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf(n("shutdown-timeout")+" must be positive, got %s", c.ShutdownTimeout))
	}
	return errors.Join(errs...)
}

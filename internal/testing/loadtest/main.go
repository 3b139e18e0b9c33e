package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/idemgate/idemgate"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// config is the load test's settings, from flags and the environment.
type config struct {
	ghz, pgbench string
	// databaseURL is a server to run on instead of the load test's own;
	// "" starts one (and Citus's nodes), whose CPU the rows read.
	databaseURL string
	// stores are the stores the gated rows run on: postgres, and citus
	// for the Citus rows.
	stores   map[string]bool
	duration time.Duration
	rounds   int
	rows     *regexp.Regexp
	results  string
	// dedupeFlags are extra flags for every Dedupe service (after the
	// load test's own, so they win), to compare settings.
	dedupeFlags []string
	// pgConf is more postgresql.conf for the run's own servers, e.g.
	// "autovacuum = off".
	pgConf string
}

func main() {
	os.Exit(run())
}

func run() int {
	cfg, err := parseConfig(os.Args[1:], os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	lt := &loadtest{cfg: cfg, h: &harness{}, payments: map[string]*server{}, dedupeOf: map[string]*server{}, batchedScripts: map[rowID]string{}}
	defer lt.cleanup()
	if err := lt.run(ctx); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "loadtest: interrupted; cleaning up")
		} else {
			fmt.Fprintln(os.Stderr, "loadtest:", err)
		}
		return 1
	}
	if len(lt.problems) > 0 {
		fmt.Fprintln(os.Stderr, "loadtest: the figures above are suspect:")
		for _, p := range lt.problems {
			fmt.Fprintln(os.Stderr, "  -", p)
		}
		return 1
	}
	return 0
}

func parseConfig(args []string, getenv func(string) string) (config, error) {
	env := func(key, def string) string {
		if v := getenv(key); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	var cfg config
	fs.StringVar(&cfg.ghz, "ghz", env("GHZ", ""), "`path` of the ghz binary; make loadtest builds the pinned one (env GHZ)")
	fs.StringVar(&cfg.pgbench, "pgbench", env("PGBENCH", "pgbench"), "pgbench `binary` (env PGBENCH)")
	fs.StringVar(&cfg.databaseURL, "database-url", env("LOADTEST_DATABASE_URL", ""),
		"PostgreSQL server `URL` to create the throwaway databases on, its user with CREATEDB; empty: a durable server of the run's own (pgtest), whose CPU the rows read, which a shared server's cannot give (env LOADTEST_DATABASE_URL)")
	citusDefault := "postgres"
	if ok, _ := citusInstalled(); ok {
		citusDefault = "postgres,citus"
	}
	stores := fs.String("stores", env("LOADTEST_STORES", citusDefault),
		"stores the gated rows run on, comma-separated: postgres, and citus (a coordinator and two workers of the run's own); default both when citus.so is installed (env LOADTEST_STORES)")
	duration := fs.String("duration", env("LOADTEST_DURATION", "10s"), "how long each row runs in each round (env LOADTEST_DURATION)")
	rounds := fs.String("rounds", env("LOADTEST_ROUNDS", "3"), "interleaved rounds, every row once a round (env LOADTEST_ROUNDS)")
	rows := fs.String("rows", env("LOADTEST_ROWS", ""), "run only the rows whose names match this `regexp`, e.g. 'pg|floor' (env LOADTEST_ROWS)")
	dedupeFlags := fs.String("dedupe-flags", env("LOADTEST_DEDUPE_FLAGS", ""), "extra `flags` for every Dedupe service, space-separated, e.g. '-store-writers=8', to compare settings (env LOADTEST_DEDUPE_FLAGS)")
	fs.StringVar(&cfg.pgConf, "pg-conf", env("LOADTEST_PG_CONF", ""), "more postgresql.conf `lines` for the run's own servers, ';' between settings, e.g. 'autovacuum = off' (env LOADTEST_PG_CONF)")
	fs.StringVar(&cfg.results, "results", env("LOADTEST_RESULTS", ""), "`directory` for the raw ghz and pgbench output; default loadtest-results/<UTC time> in the repository (env LOADTEST_RESULTS)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	var err error
	if cfg.duration, err = time.ParseDuration(*duration); err != nil || cfg.duration < time.Second {
		return config{}, fmt.Errorf("-duration %q: want a duration of 1s or more", *duration)
	}
	if cfg.rounds, err = strconv.Atoi(*rounds); err != nil || cfg.rounds < 1 {
		return config{}, fmt.Errorf("-rounds %q: want 1 or more", *rounds)
	}
	cfg.dedupeFlags = strings.Fields(*dedupeFlags)
	if cfg.stores, err = parseStores(*stores); err != nil {
		return config{}, err
	}
	if ok, path := citusInstalled(); cfg.stores["citus"] && !ok {
		return config{}, fmt.Errorf("-stores citus: Citus is not installed (no %s); run bash ../shared/citus/build.sh, or LOADTEST_STORES=postgres", path)
	}
	if cfg.stores["citus"] && cfg.databaseURL != "" {
		return config{}, errors.New("-stores citus starts servers of its own, so it runs without -database-url")
	}
	for _, f := range cfg.dedupeFlags {
		if !strings.HasPrefix(f, "-") {
			return config{}, fmt.Errorf("-dedupe-flags: %q is not a flag; write each as -name=value", f)
		}
	}
	if cfg.rows, err = regexp.Compile(*rows); err != nil {
		return config{}, fmt.Errorf("-rows: %w", err)
	}
	if cfg.ghz == "" {
		return config{}, errors.New("-ghz is required: run make loadtest, which builds the pinned ghz")
	}
	if cfg.ghz, err = exec.LookPath(cfg.ghz); err != nil {
		return config{}, fmt.Errorf("ghz: %w (make loadtest builds it with go install)", err)
	}
	if cfg.pgbench, err = exec.LookPath(cfg.pgbench); err != nil {
		return config{}, fmt.Errorf("pgbench is needed for the floor pair and was not found (%v): on Debian it comes with the server, apt-get install postgresql; or pass -pgbench PATH", err)
	}
	return cfg, nil
}

// loadtest is one run: its settings, what it created, what it measured.
type loadtest struct {
	cfg      config
	repo     string   // the repository's root, holding go.mod and proto/
	tmp      string   // binaries and the embedded store's data
	admin    string   // the server URL the throwaway databases are made on
	dbs      []string // the throwaway databases created
	svcURL   string   // the Dedupe service's database
	floorURL string   // the floor pair's database
	floor    floorScript
	pg       string // the payments server gated through PostgreSQL
	pgCached string // a second one on the same Dedupe service, with the replay cache on; "" when its row is not run
	// pgAfterReply is a third one on the same Dedupe service, with
	// -finish-after-reply; "" when none of its rows is run.
	pgAfterReply string
	// pgInProcess is a payments server running its own Dedupe service
	// (-dedupe in-process) on the PostgreSQL database; "" when none of its
	// rows is run.
	pgInProcess string
	// sqliteInProcess is one running its own Dedupe service on the
	// embedded store; "" when its row is not run.
	sqliteInProcess string
	// pgToolMetrics is the /metrics URL of the payments server in front of
	// it (lt.pg), for the latency budget.
	pgToolMetrics string
	// pgMetrics is the PostgreSQL Dedupe service's /metrics URL, for the
	// replays it serves.
	pgMetrics string
	sqlite    string // the payments server gated through the embedded store
	rounds    []round
	problems  []string

	// h holds the servers the run started (pgtest), removed at cleanup.
	h *harness
	// pgServer is the run's own PostgreSQL server; nil with -database-url.
	pgServer *pgtest.Cluster
	// citus is the run's Citus cluster; nil without -stores citus.
	citus *citusCluster
	// pgNoGC is the payments server on the Dedupe service without group
	// commit, citusPay the one on the Citus coordinator; "" when their
	// rows are not run.
	pgNoGC, pgNoQuota, citusPay, citusNoQuota string
	// payments are the payments servers by address, dedupeOf the Dedupe
	// service each calls (absent for one running its own in-process), for
	// the CPU a row reads.
	payments map[string]*server
	dedupeOf map[string]*server
	// nogcURL is the no-group-commit Dedupe service's database.
	nogcURL string
	// batchedScripts are the batched floor's pgbench scripts by row.
	batchedScripts map[rowID]string
	// storage and citusRecords, citusBytes: the sizes read after the
	// rounds.
	storage      *storage
	citusRecords int64
	citusBytes   map[int]int64
}

// dbPrefix names the throwaway databases; the pid that follows lets a later
// run drop those of a run that was killed.
const dbPrefix = "idemgate_loadtest_"

func (lt *loadtest) run(ctx context.Context) error {
	var err error
	if lt.repo, err = repoRoot(); err != nil {
		return err
	}
	if lt.cfg.results == "" {
		lt.cfg.results = filepath.Join(lt.repo, "loadtest-results", time.Now().UTC().Format("20060102T150405Z"))
	}
	if err := os.MkdirAll(lt.cfg.results, 0o755); err != nil {
		return err
	}
	removeDeadTemp()
	if lt.tmp, err = os.MkdirTemp("", fmt.Sprintf("%s%d-", tmpPrefix, os.Getpid())); err != nil {
		return err
	}

	fmt.Println("loadtest: building cmd/dedupesvc and cmd/payments-server")
	bins, err := buildBinaries(ctx, lt.tmp, "github.com/idemgate/idemgate/cmd/dedupesvc", "github.com/idemgate/idemgate/cmd/payments-server")
	if err != nil {
		return err
	}
	dedupeBin, paymentsBin := bins[0], bins[1]

	if lt.cfg.databaseURL == "" {
		fmt.Println("loadtest: starting a PostgreSQL server of the run's own (durable: fsync on)")
		if lt.pgServer, err = startCluster(lt.h, serverConf+pgConfLines(lt.cfg.pgConf)); err != nil {
			return err
		}
	}
	if lt.cfg.stores["citus"] && lt.runs(citusRows...) {
		fmt.Println("loadtest: starting a Citus coordinator and two workers")
		if lt.citus, err = startCitus(ctx, lt.h, pgConfLines(lt.cfg.pgConf)); err != nil {
			return err
		}
	}
	if err := lt.createDatabases(ctx); err != nil {
		return err
	}
	reserve, finish, key, epoch, err := captureFloor(ctx, lt.floorURL)
	if err != nil {
		return fmt.Errorf("capture the floor pair from pgstore: %w", err)
	}
	if lt.floor, err = renderFloor(reserve, finish, key, epoch); err != nil {
		return fmt.Errorf("floor pair: %w", err)
	}
	if err := os.WriteFile(filepath.Join(lt.cfg.results, "floor.sql"), []byte(lt.floor.Script), 0o644); err != nil {
		return err
	}
	for id, callers := range map[rowID]int{rowFloorBatched16: 16, rowFloorBatched64: 64} {
		path := filepath.Join(lt.cfg.results, fmt.Sprintf("floor-batched-%d.sql", callers))
		script, err := lt.floor.batched(callers / batchedWriters)
		if err != nil {
			return fmt.Errorf("batched floor: %w", err)
		}
		if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
			return err
		}
		lt.batchedScripts[id] = path
	}

	// The Dedupe service's per-caller rate limit (10,000 Begins/s, bursts
	// of 10,000) and quotas are raised far past what a run reaches, not turned
	// off, so every Begin still takes the limiter and reads the usage as
	// with the defaults; the pool is the default, 16. The same flags go to
	// the Dedupe service run in-process.
	common := []string{
		"-db-max-conns=16",
		"-caller-begin-rate=1000000", "-caller-begin-burst=1000000",
		"-caller-max-records=1000000000000", "-caller-max-bytes=1000000000000000",
	}
	common = append(common, lt.cfg.dedupeFlags...)
	// The PostgreSQL Dedupe service serves /metrics, where the replay rows
	// read how many replays it served; the others serve none.
	metricsAddr, err := freeAddr()
	if err != nil {
		return err
	}
	lt.pgMetrics = "http://" + metricsAddr + "/metrics"
	// Its first payments server serves /metrics too: with the service's,
	// the stage histograms of both sides give the latency budget of one
	// caller (the gated pg c=1 row).
	toolMetricsAddr, err := freeAddr()
	if err != nil {
		return err
	}
	lt.pgToolMetrics = "http://" + toolMetricsAddr + "/metrics"
	var pgDedupe *server
	var pgDedupeAddr string
	if lt.pg, pgDedupe, pgDedupeAddr, err = lt.startStack(ctx, "pg", dedupeBin, paymentsBin,
		append([]string{"-database-url=" + lt.svcURL, "-metrics-listen=" + metricsAddr}, common...), "-metrics-listen="+toolMetricsAddr); err != nil {
		return err
	}
	if lt.runs(rowReplayCached) {
		// Room for every key a run replays, and the warm-up's, many times
		// over; -replay-cache-bytes keeps its default.
		if lt.pgCached, err = lt.startPayments(ctx, "pg-cached", paymentsBin, pgDedupeAddr, pgDedupe, "-replay-cache-entries=10000"); err != nil {
			return err
		}
	}
	if lt.runs(rowAfterReply1, rowAfterReply16, rowAfterReply64) {
		if lt.pgAfterReply, err = lt.startPayments(ctx, "pg-after-reply", paymentsBin, pgDedupeAddr, pgDedupe, "-finish-after-reply"); err != nil {
			return err
		}
	}
	if lt.runs(rowInProcess1, rowInProcess64) {
		// Its pool closes connections idle for a second: the floor's 64
		// clients come after its rows, and with both services' pools full
		// (16 each) they would take PostgreSQL's default max_connections,
		// 100, shared with whatever else uses the server. Its rows keep
		// their connections busy, so this changes nothing they measure.
		inProcessURL, err := withPoolIdle(lt.svcURL, "1s")
		if err != nil {
			return err
		}
		if lt.pgInProcess, err = lt.startPayments(ctx, "pg-in-process", paymentsBin, inProcessDedupe, nil,
			append([]string{"--", "-database-url=" + inProcessURL, "-metrics-listen="}, common...)...); err != nil {
			return err
		}
	}
	if lt.runs(rowSQLiteInProcess64) {
		if lt.sqliteInProcess, err = lt.startPayments(ctx, "sqlite-in-process", paymentsBin, inProcessDedupe, nil,
			append([]string{"--", "-database-url=", "-data-dir=" + filepath.Join(lt.tmp, "sqlite-in-process"), "-metrics-listen="}, common...)...); err != nil {
			return err
		}
	}
	if lt.runs(rowNoGC16, rowNoGC64) {
		if lt.pgNoGC, _, _, err = lt.startStack(ctx, "pg-no-group-commit", dedupeBin, paymentsBin,
			append(append([]string{"-database-url=" + lt.nogcURL, "-metrics-listen="}, common...), "-store-max-batch=1")); err != nil {
			return err
		}
	}
	if lt.runs(rowPGNoQuota16, rowPGNoQuota64) {
		if lt.pgNoQuota, _, _, err = lt.startStack(ctx, "pg-no-quota", dedupeBin, paymentsBin,
			append(append([]string{"-database-url=" + lt.svcURL, "-metrics-listen="}, common...),
				"-caller-max-records=0", "-caller-max-bytes=0")); err != nil {
			return err
		}
	}
	if lt.citus != nil {
		if lt.citusPay, _, _, err = lt.startStack(ctx, "citus", dedupeBin, paymentsBin,
			append([]string{"-database-url=" + lt.citus.coordinator.URL("postgres"), "-metrics-listen="}, common...)); err != nil {
			return err
		}
		if err := lt.checkCitusForms("citus"); err != nil {
			return err
		}
		if lt.runs(rowCitusNoQuota16, rowCitusNoQuota64) {
			if lt.citusNoQuota, _, _, err = lt.startStack(ctx, "citus-no-quota", dedupeBin, paymentsBin,
				append(append([]string{"-database-url=" + lt.citus.coordinator.URL("postgres"), "-metrics-listen="}, common...),
					"-caller-max-records=0", "-caller-max-bytes=0")); err != nil {
				return err
			}
			if err := lt.checkCitusForms("citus-no-quota"); err != nil {
				return err
			}
		}
	}
	sqliteDir := filepath.Join(lt.tmp, "sqlite")
	if lt.sqlite, _, _, err = lt.startStack(ctx, "sqlite", dedupeBin, paymentsBin,
		append([]string{"-database-url=", "-data-dir=" + sqliteDir, "-metrics-listen="}, common...)); err != nil {
		return err
	}

	settings, err := lt.settings(ctx)
	if err != nil {
		return err
	}
	fmt.Println(settings)
	if err := lt.warmUp(ctx); err != nil {
		return err
	}
	for r := 1; r <= lt.cfg.rounds; r++ {
		rd := round{Samples: map[rowID]sample{}, Start: readLoad()}
		for _, id := range allRows {
			if !lt.runs(id) {
				continue
			}
			s, err := lt.runRow(ctx, id, r)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r, id, err)
			}
			if s.Errors > 0 {
				lt.problems = append(lt.problems, fmt.Sprintf("round %d, %s: %d of %d calls failed (see %s)", r, id, s.Errors, s.Count, lt.cfg.results))
			}
			rd.Samples[id] = s
			hits := ""
			if h, ok := s.hitRatio(); ok {
				hits = fmt.Sprintf("  cache hits %.3f", h)
			}
			var servers time.Duration
			for role, d := range s.CPU {
				if role != roleClient {
					servers += d
				}
			}
			cpu := ""
			if v, ok := perThousand(servers, s.Count-s.Errors); ok {
				cpu = fmt.Sprintf("  CPU-s/1k calls %.3f", v)
			}
			// The service's Begin, all its stages' means: how a Begin's cost
			// moves from round to round over a long run.
			begin := ""
			if d := serviceBegin(s.Budget); d > 0 {
				begin = "  service Begin " + formatDuration(d)
			}
			fmt.Printf("round %d/%d  %-25s p50 %-8s p99 %-8s %8.0f req/s  errors %d  load %.2f%s%s%s\n",
				r, lt.cfg.rounds, id, formatDuration(s.P50), formatDuration(s.P99), s.RPS, s.Errors, readLoad()[0], cpu, hits, begin)
		}
		rd.Stop = readLoad()
		lt.rounds = append(lt.rounds, rd)
	}

	if err := lt.measureStorage(ctx); err != nil {
		return err
	}
	var report bytes.Buffer
	writeReport(&report, lt.rounds, settings)
	lt.writeStorage(&report)
	fmt.Println()
	fmt.Print(report.String())
	fmt.Printf("\nraw output: %s\n", lt.cfg.results)
	return os.WriteFile(filepath.Join(lt.cfg.results, "report.md"), report.Bytes(), 0o644)
}

// cleanup stops the servers, drops the databases and removes the temporary
// directory; it runs however run ended.
func (lt *loadtest) cleanup() {
	start := time.Now()
	stopAll()
	fmt.Fprintf(os.Stderr, "loadtest: servers stopped (%s)\n", time.Since(start).Round(time.Millisecond))
	if len(lt.dbs) > 0 && lt.pgServer == nil {
		// DROP DATABASE waits for a checkpoint: seconds after a long run.
		fmt.Fprintf(os.Stderr, "loadtest: dropping %s\n", strings.Join(lt.dbs, ", "))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if conn, err := pgx.Connect(ctx, lt.admin); err != nil {
			fmt.Fprintf(os.Stderr, "loadtest: could not drop %s: %v\n", strings.Join(lt.dbs, ", "), err)
		} else {
			for _, db := range lt.dbs {
				if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
					fmt.Fprintf(os.Stderr, "loadtest: drop database %s: %v\n", db, err)
				}
			}
			conn.Close(ctx)
		}
	}
	if lt.tmp != "" {
		_ = os.RemoveAll(lt.tmp)
	}
	lt.h.close() // the run's own servers
	fmt.Fprintf(os.Stderr, "loadtest: cleaned up (%s)\n", time.Since(start).Round(time.Millisecond))
}

// tmpPrefix names the temporary directories (binaries, the embedded
// store); the pid that follows lets a later run remove those of a run that
// was killed.
const tmpPrefix = "idemgate-loadtest-"

// removeDeadTemp removes the temporary directories of runs that are gone.
func removeDeadTemp() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tmpPrefix+"*"))
	for _, dir := range dirs {
		if pid, ok := deadPid(strings.TrimPrefix(filepath.Base(dir), tmpPrefix)); ok {
			fmt.Printf("loadtest: removing %s, left by run %d that died\n", dir, pid)
			_ = os.RemoveAll(dir)
		}
	}
}

// deadPid reads the pid that starts s (up to an underscore or a dash) and
// reports whether no such process runs.
func deadPid(s string) (int, bool) {
	end := strings.IndexAny(s, "_-")
	if end < 0 {
		return 0, false
	}
	pid, err := strconv.Atoi(s[:end])
	return pid, err == nil && pid > 0 && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// createDatabases drops the databases of earlier runs that died, then
// creates this run's two: the Dedupe service's (it migrates it on start)
// and the floor pair's.
func (lt *loadtest) createDatabases(ctx context.Context) error {
	lt.admin = lt.cfg.databaseURL
	if lt.pgServer != nil {
		lt.admin = lt.pgServer.URL("postgres")
	}
	conn, err := pgx.Connect(ctx, lt.admin)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL at %s: %w", redact(lt.admin), err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", dbPrefix)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, name := range names {
		if pid, ok := deadPid(strings.TrimPrefix(name, dbPrefix)); ok {
			fmt.Printf("loadtest: dropping %s, left by run %d that died\n", name, pid)
			if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
				return err
			}
		}
	}
	suffix := strings.ToLower(rand.Text()[:6])
	roles := []string{"svc", "floor"}
	if lt.runs(rowNoGC16, rowNoGC64) {
		roles = append(roles, "nogc")
	}
	for _, role := range roles {
		name := fmt.Sprintf("%s%d_%s_%s", dbPrefix, os.Getpid(), suffix, role)
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			return fmt.Errorf("create database %s: %w", name, err)
		}
		lt.dbs = append(lt.dbs, name)
		u, err := withDatabase(lt.admin, name)
		if err != nil {
			return err
		}
		switch role {
		case "svc":
			lt.svcURL = u
		case "nogc":
			lt.nogcURL = u
		default:
			lt.floorURL = u
		}
	}
	return nil
}

// runs reports whether any of the rows ids is selected.
func (lt *loadtest) runs(ids ...rowID) bool {
	for _, id := range ids {
		if lt.cfg.rows.MatchString(string(id)) {
			return true
		}
	}
	return false
}

// inProcessDedupe is payments-server's -dedupe value that runs the Dedupe
// service in its own process.
const inProcessDedupe = "in-process"

// withPoolIdle returns the database URL u with pgxpool's settings to close
// connections idle for d, checked every half second.
func withPoolIdle(u, d string) (string, error) {
	parsed, err := url.Parse(u)
	if err != nil {
		return "", fmt.Errorf("database URL: %w", err)
	}
	q := parsed.Query()
	q.Set("pool_max_conn_idle_time", d)
	q.Set("pool_health_check_period", "500ms")
	parsed.RawQuery = q.Encode()
	return parsed.String(), nil
}

// withDatabase returns the URL u naming database db instead.
func withDatabase(u, db string) (string, error) {
	parsed, err := url.Parse(u)
	if err != nil {
		return "", fmt.Errorf("database URL: %w", err)
	}
	parsed.Path = "/" + db
	return parsed.String(), nil
}

// redact drops a URL's password, for messages.
func redact(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return parsed.Redacted()
}

// startStack starts a Dedupe service with dedupeArgs and a payments server
// gated through it, waits until a gated call goes through, and returns the
// payments server's address, and the Dedupe service with its address for
// another payments server in front of it.
func (lt *loadtest) startStack(ctx context.Context, name, dedupeBin, paymentsBin string, dedupeArgs []string, payExtra ...string) (payAddr string, dedupe *server, dedupeAddr string, err error) {
	if dedupeAddr, err = freeAddr(); err != nil {
		return "", nil, "", err
	}
	dedupe, err = startServer("dedupesvc "+name, dedupeBin, append([]string{"-listen=" + dedupeAddr}, dedupeArgs...),
		filepath.Join(lt.cfg.results, "dedupesvc-"+name+".log"))
	if err != nil {
		return "", nil, "", err
	}
	if payAddr, err = lt.startPayments(ctx, name, paymentsBin, dedupeAddr, dedupe, payExtra...); err != nil {
		return "", nil, "", err
	}
	return payAddr, dedupe, dedupeAddr, nil
}

// startPayments starts a payments server with extra flags, gated through
// the Dedupe service dedupe at dedupeAddr (nil, and dedupeAddr
// inProcessDedupe, for one that runs its own), waits until a gated call
// goes through, and returns its address.
func (lt *loadtest) startPayments(ctx context.Context, name, paymentsBin, dedupeAddr string, dedupe *server, extra ...string) (string, error) {
	payAddr, err := freeAddr()
	if err != nil {
		return "", err
	}
	pay, err := startServer("payments-server "+name, paymentsBin, append([]string{"-listen=" + payAddr, "-dedupe=" + dedupeAddr}, extra...),
		filepath.Join(lt.cfg.results, "payments-server-"+name+".log"))
	if err != nil {
		return "", err
	}
	lt.payments[payAddr] = pay
	if dedupe != nil {
		lt.dedupeOf[payAddr] = dedupe
	}
	conn, err := grpc.NewClient(payAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	client := paymentsv1.NewPaymentsServiceClient(conn)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		callCtx = metadata.AppendToOutgoingContext(callCtx, idemgate.KeyHeader, "loadtest-ready-"+rand.Text())
		_, err = client.ChargeCard(callCtx, &paymentsv1.ChargeCardRequest{CustomerId: "cust_ready", AmountCents: 1})
		cancel()
		if err == nil {
			shown := make([]string, len(extra))
			for i, a := range extra {
				if u, ok := strings.CutPrefix(a, "-database-url="); ok && u != "" {
					a = "-database-url=" + redact(u)
				}
				shown[i] = a
			}
			fmt.Printf("loadtest: %s stack up: dedupesvc on %s, payments-server on %s%s\n", name, dedupeAddr, payAddr, strings.TrimRight(" "+strings.Join(shown, " "), " "))
			return payAddr, nil
		}
		for _, s := range []*server{dedupe, pay} {
			if s == nil {
				continue
			}
			if done, exitErr := s.exited(); done {
				return "", fmt.Errorf("%s exited (%v) before serving:\n%s", s.name, exitErr, s.tail())
			}
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if time.Now().After(deadline) {
			tails := pay.tail()
			if dedupe != nil {
				tails = dedupe.tail() + "\n" + tails
			}
			return "", fmt.Errorf("%s stack: no gated call went through in 2 minutes: %v\n%s", name, err, tails)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// settings describes the run and the machine, for the report.
func (lt *loadtest) settings(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, lt.svcURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var pgVersion string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&pgVersion); err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, lt.cfg.pgbench, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("pgbench --version: %w", err)
	}
	server := "the server at " + redact(lt.admin)
	if lt.pgServer != nil {
		server = "servers of the run's own, fsync on"
		if lt.citus != nil {
			server += "; Citus: a coordinator and 2 workers, " + citusVersion(ctx, lt.citus.coordinator.URL("postgres"))
		}
	}
	return fmt.Sprintf("%d rounds of %s a row; ghz %s (one connection), %s; %s, PostgreSQL %s (%s), %d CPUs, %s",
		lt.cfg.rounds, lt.cfg.duration, strings.TrimPrefix(filepath.Base(filepath.Dir(lt.cfg.ghz)), "ghz-"),
		strings.TrimSpace(string(out)), runtime.Version(), pgVersion, server, runtime.NumCPU(), cpuModel()) + extraFlags(lt.cfg.dedupeFlags), nil
}

// extraFlags names the -dedupe-flags of a run for its settings line.
func extraFlags(flags []string) string {
	if len(flags) == 0 {
		return ""
	}
	return "; every Dedupe service also with " + strings.Join(flags, " ")
}

// warmUp runs each stack and the floor briefly, unrecorded: first
// connections, prepared statements and page cache are not what a round
// measures.
func (lt *loadtest) warmUp(ctx context.Context) error {
	fmt.Println("loadtest: warming up")
	targets := map[string]string{"warmup-pg": lt.pg, "warmup-sqlite": lt.sqlite}
	for name, target := range map[string]string{"warmup-pg-no-group-commit": lt.pgNoGC, "warmup-pg-no-quota": lt.pgNoQuota, "warmup-citus": lt.citusPay, "warmup-citus-no-quota": lt.citusNoQuota, "warmup-pg-cached": lt.pgCached, "warmup-pg-after-reply": lt.pgAfterReply, "warmup-pg-in-process": lt.pgInProcess, "warmup-sqlite-in-process": lt.sqliteInProcess} {
		if target != "" {
			targets[name] = target
		}
	}
	for name, target := range targets {
		if _, err := lt.ghz(ctx, name, target, "ChargeCard", 16, freshKey, chargeData("cust_loadtest"), "--total", "400"); err != nil {
			return err
		}
	}
	_, err := lt.pgbench(ctx, "warmup-floor", 4, 1)
	return err
}

// freshKey is ghz metadata giving every call its own idempotency key.
var freshKey = fmt.Sprintf(`{%q:"{{.UUID}}"}`, idemgate.KeyHeader)

func chargeData(customer string) string {
	return fmt.Sprintf(`{"customer_id":%q,"amount_cents":100}`, customer)
}

// runRow runs one row once, and reads the CPU each of its processes used
// and its servers' writes.
func (lt *loadtest) runRow(ctx context.Context, id rowID, r int) (sample, error) {
	targets, dbs, err := lt.accounting(id)
	if err != nil {
		return sample{}, err
	}
	cpuBefore, err := readCPU(targets)
	if err != nil {
		return sample{}, err
	}
	countsBefore, err := sumCounts(ctx, dbs)
	if err != nil {
		return sample{}, err
	}
	start := time.Now()
	s, err := lt.runRowOnce(ctx, id, r)
	if err != nil {
		return s, err
	}
	cpuAfter, err := readCPU(targets)
	s.Elapsed = time.Since(start)
	if err != nil {
		return sample{}, err
	}
	countsAfter, err := sumCounts(ctx, dbs)
	if err != nil {
		return sample{}, err
	}
	client := s.CPU[roleClient]
	s.CPU = cpuBetween(cpuBefore, cpuAfter)
	s.CPU[roleClient] = client
	if len(dbs) > 0 {
		s.Xids, s.WAL, s.CountsRead = countsAfter.xids-countsBefore.xids, countsAfter.wal-countsBefore.wal, true
	}
	return s, nil
}

// runRowOnce runs one row once.
func (lt *loadtest) runRowOnce(ctx context.Context, id rowID, r int) (sample, error) {
	name := fmt.Sprintf("r%d-%s", r, strings.NewReplacer(" ", "-", "=", "").Replace(string(id)))
	secs := int(math.Ceil(lt.cfg.duration.Seconds()))
	dur := []string{"--duration", lt.cfg.duration.String(), "--duration-stop", "wait"}
	switch id {
	case rowUngated:
		return lt.ghz(ctx, name, lt.pg, "GetBalance", 1, "", `{"customer_id":"cust_loadtest"}`, dur...)
	case rowPG1:
		return lt.withBudget(ctx, func() (sample, error) { return lt.fresh(ctx, name, lt.pg, 1, dur) })
	case rowPG16:
		return lt.fresh(ctx, name, lt.pg, 16, dur)
	case rowPG64:
		return lt.fresh(ctx, name, lt.pg, 64, dur)
	case rowAfterReply1:
		return lt.fresh(ctx, name, lt.pgAfterReply, 1, dur)
	case rowAfterReply16:
		return lt.fresh(ctx, name, lt.pgAfterReply, 16, dur)
	case rowAfterReply64:
		return lt.fresh(ctx, name, lt.pgAfterReply, 64, dur)
	case rowInProcess1:
		return lt.fresh(ctx, name, lt.pgInProcess, 1, dur)
	case rowInProcess64:
		return lt.fresh(ctx, name, lt.pgInProcess, 64, dur)
	case rowSQLite1:
		return lt.fresh(ctx, name, lt.sqlite, 1, dur)
	case rowSQLite64:
		return lt.fresh(ctx, name, lt.sqlite, 64, dur)
	case rowSQLiteInProcess64:
		return lt.fresh(ctx, name, lt.sqliteInProcess, 64, dur)
	case rowReplay:
		return lt.withBudget(ctx, func() (sample, error) { return lt.replay(ctx, name, lt.pg, false, r, dur) })
	case rowReplayCached:
		return lt.replay(ctx, name, lt.pgCached, true, r, dur)
	case rowFloor1:
		return lt.pgbench(ctx, name, 1, secs)
	case rowFloor16:
		return lt.pgbench(ctx, name, 16, secs)
	case rowFloor64:
		return lt.pgbench(ctx, name, 64, secs)
	case rowFloorBatched16:
		return lt.pgbenchScript(ctx, name, lt.batchedScripts[id], batchedWriters, secs, 16/batchedWriters)
	case rowFloorBatched64:
		return lt.pgbenchScript(ctx, name, lt.batchedScripts[id], batchedWriters, secs, 64/batchedWriters)
	case rowNoGC16:
		return lt.fresh(ctx, name, lt.pgNoGC, 16, dur)
	case rowNoGC64:
		return lt.fresh(ctx, name, lt.pgNoGC, 64, dur)
	case rowCitus1:
		return lt.fresh(ctx, name, lt.citusPay, 1, dur)
	case rowCitus16:
		return lt.fresh(ctx, name, lt.citusPay, 16, dur)
	case rowCitus64:
		return lt.fresh(ctx, name, lt.citusPay, 64, dur)
	case rowIdlePG, rowIdleCitus:
		select {
		case <-ctx.Done():
			return sample{}, ctx.Err()
		case <-time.After(lt.cfg.duration):
		}
		return sample{}, nil
	case rowPGNoQuota16:
		return lt.fresh(ctx, name, lt.pgNoQuota, 16, dur)
	case rowPGNoQuota64:
		return lt.fresh(ctx, name, lt.pgNoQuota, 64, dur)
	case rowCitusNoQuota16:
		return lt.fresh(ctx, name, lt.citusNoQuota, 16, dur)
	case rowCitusNoQuota64:
		return lt.fresh(ctx, name, lt.citusNoQuota, 64, dur)
	}
	return sample{}, fmt.Errorf("unknown row %q", id)
}

// ghz calls method of the payments server at target from callers workers
// over one connection and reads its JSON report.
func (lt *loadtest) ghz(ctx context.Context, name, target, method string, callers int, md, data string, extra ...string) (sample, error) {
	out := filepath.Join(lt.cfg.results, name+".ghz.json")
	args := []string{
		"--insecure",
		"--proto", filepath.Join(lt.repo, "proto/examples/payments/v1/payments.proto"),
		"--import-paths", filepath.Join(lt.repo, "proto"),
		"--call", "examples.payments.v1.PaymentsService." + method,
		"--concurrency", strconv.Itoa(callers), "--connections", "1",
		"--data", data, "--format", "json", "--output", out,
	}
	if md != "" {
		args = append(args, "--metadata", md)
	}
	args = append(append(args, extra...), target)
	clientCPU, err := runTool(ctx, filepath.Join(lt.cfg.results, name+".ghz.log"), lt.cfg.ghz, args...)
	if err != nil {
		return sample{}, err
	}
	f, err := os.Open(out)
	if err != nil {
		return sample{}, err
	}
	defer f.Close()
	s, rep, err := parseGhz(f)
	if err != nil {
		return sample{}, fmt.Errorf("%s: %w", out, err)
	}
	s.CPU = map[cpuRole]time.Duration{roleClient: clientCPU}
	if s.Errors > 0 {
		fmt.Printf("loadtest: %s: status codes %v, errors %v\n", name, rep.StatusCodes, rep.Errors)
	}
	return s, nil
}

// fresh runs ChargeCard with a fresh key a call, and checks the ledger
// afterwards: one charge for every call that succeeded, or the keys were
// not fresh and the row measured replays.
func (lt *loadtest) fresh(ctx context.Context, name, target string, callers int, dur []string) (sample, error) {
	before, err := charges(ctx, target, "cust_loadtest")
	if err != nil {
		return sample{}, err
	}
	s, err := lt.ghz(ctx, name, target, "ChargeCard", callers, freshKey, chargeData("cust_loadtest"), dur...)
	if err != nil {
		return sample{}, err
	}
	after, err := charges(ctx, target, "cust_loadtest")
	if err != nil {
		return sample{}, err
	}
	if ran := after - before; ran != s.Count-s.Errors {
		lt.problems = append(lt.problems, fmt.Sprintf("%s: %d charges ran for %d successful calls with fresh keys", name, ran, s.Count-s.Errors))
	}
	return s, nil
}

// charges asks the payments server at target how many charges ran for
// customer.
func charges(ctx context.Context, target, customer string) (int64, error) {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	bal, err := paymentsv1.NewPaymentsServiceClient(conn).GetBalance(callCtx, &paymentsv1.GetBalanceRequest{CustomerId: customer})
	if err != nil {
		return 0, fmt.Errorf("GetBalance on %s: %w", target, err)
	}
	return bal.GetCharges(), nil
}

// replay makes one call with a key of its own on the payments server at
// target, then repeats it from one caller for the row's duration: every
// repeat is a replay (from the replay cache, when target has it on:
// cached). It checks the ledger afterwards: one charge, or the row measured
// something else. It reads the replays the PostgreSQL Dedupe service served
// during the repeats from its metrics: every repeat without the cache, and
// what the cache missed with it, which must be under a tenth.
func (lt *loadtest) replay(ctx context.Context, name, target string, cached bool, r int, dur []string) (sample, error) {
	key := fmt.Sprintf("loadtest-replay-%d-%s", r, rand.Text())
	customer := fmt.Sprintf("cust_replay_%d_%s", r, rand.Text()[:8])
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return sample{}, err
	}
	defer conn.Close()
	client := paymentsv1.NewPaymentsServiceClient(conn)
	callCtx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, key), 30*time.Second)
	defer cancel()
	if _, err := client.ChargeCard(callCtx, &paymentsv1.ChargeCardRequest{CustomerId: customer, AmountCents: 100}); err != nil {
		return sample{}, fmt.Errorf("the first call: %w", err)
	}
	before, err := lt.serviceReplays(ctx)
	if err != nil {
		return sample{}, err
	}
	s, err := lt.ghz(ctx, name, target, "ChargeCard", 1, fmt.Sprintf(`{%q:%q}`, idemgate.KeyHeader, key), chargeData(customer), dur...)
	if err != nil {
		return sample{}, err
	}
	after, err := lt.serviceReplays(ctx)
	if err != nil {
		return sample{}, err
	}
	s.ServiceReplays, s.ReplaysRead = int64(after-before), true
	if hits, ok := s.hitRatio(); ok {
		switch {
		case cached && hits < 0.9:
			lt.problems = append(lt.problems, fmt.Sprintf("%s: the replay cache answered %.3f of the calls, want 0.9 or more: the Dedupe service served %d replays for %d calls",
				name, hits, s.ServiceReplays, s.Count-s.Errors))
		case !cached && hits > 0.1:
			lt.problems = append(lt.problems, fmt.Sprintf("%s: the Dedupe service counted %d replays for %d calls with no replay cache in front, where every call is one: "+
				"its idemgate_dedupe_replays_total does not count what this row measures, so neither can the cached row's hit ratio", name, s.ServiceReplays, s.Count-s.Errors))
		}
	}
	ran, err := charges(ctx, target, customer)
	if err != nil {
		return sample{}, err
	}
	if ran != 1 {
		lt.problems = append(lt.problems, fmt.Sprintf("%s: %d charges ran for one key, want 1", name, ran))
	}
	return s, nil
}

// scrape reads the Prometheus exposition at url.
func scrape(ctx context.Context, url string) (string, error) {
	reqCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("metrics at %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("metrics at %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("metrics at %s: %s", url, resp.Status)
	}
	return string(body), nil
}

// serviceReplays reads the replays the PostgreSQL Dedupe service has
// served, from its metrics.
func (lt *loadtest) serviceReplays(ctx context.Context) (float64, error) {
	text, err := scrape(ctx, lt.pgMetrics)
	if err != nil {
		return 0, fmt.Errorf("the Dedupe service's %w", err)
	}
	n, err := parseReplays(text)
	if err != nil {
		return 0, fmt.Errorf("the Dedupe service's metrics at %s: %w", lt.pgMetrics, err)
	}
	return n, nil
}

// stages reads the stage histograms of the pg payments server and its
// Dedupe service.
func (lt *loadtest) stages(ctx context.Context) (map[stageKey]stageSum, error) {
	all := map[stageKey]stageSum{}
	for _, url := range []string{lt.pgToolMetrics, lt.pgMetrics} {
		text, err := scrape(ctx, url)
		if err != nil {
			return nil, err
		}
		got, err := parseStages(text)
		if err != nil {
			return nil, fmt.Errorf("metrics at %s: %w", url, err)
		}
		for k, v := range got {
			all[k] = v
		}
	}
	return all, nil
}

// withBudget runs a row of the pg payments server and attaches its latency
// budget: each stage's mean over the row, from the stage histograms read
// before and after. A stage with no observation during the row is left out;
// the run is suspect when the gate's or the service's Begin stages saw none.
func (lt *loadtest) withBudget(ctx context.Context, row func() (sample, error)) (sample, error) {
	before, err := lt.stages(ctx)
	if err != nil {
		return sample{}, err
	}
	s, err := row()
	if err != nil {
		return s, err
	}
	after, err := lt.stages(ctx)
	if err != nil {
		return sample{}, err
	}
	s.Budget = budgetBetween(before, after)
	for _, k := range []stageKey{{"tool", "", "begin"}, {"service", "Begin", "statement"}} {
		if _, ok := s.Budget[k]; !ok {
			lt.problems = append(lt.problems, fmt.Sprintf("the latency budget has no %s %s %s stage: the stage metrics did not count the row's calls", k.side, k.rpc, k.stage))
		}
	}
	return s, nil
}

// pgbench runs the floor pair from clients clients for secs seconds, and
// checks that every pair it ran completed its record.
func (lt *loadtest) pgbench(ctx context.Context, name string, clients, secs int) (sample, error) {
	return lt.pgbenchScript(ctx, name, filepath.Join(lt.cfg.results, "floor.sql"), clients, secs, 1)
}

// pgbenchScript runs script, pairs floor pairs a run of it, from clients
// clients for secs seconds, and checks that every pair it ran completed its
// record. The sample counts pairs: req/s is pairs a second, the latencies
// are a run's (pairs pairs).
func (lt *loadtest) pgbenchScript(ctx context.Context, name, script string, clients, secs, pairs int) (sample, error) {
	prefix := filepath.Join(lt.cfg.results, name+".pgbench")
	args := []string{"-n", "-M", "prepared", "-f", script, "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, runtime.NumCPU())),
		"-T", strconv.Itoa(secs), "--log", "--log-prefix", prefix}
	for _, v := range lt.floor.Vars {
		args = append(args, "-D", v)
	}
	args = append(args, lt.floorURL)
	outPath := prefix + ".out"
	clientCPU, err := runTool(ctx, outPath, lt.cfg.pgbench, args...)
	if err != nil {
		return sample{}, err
	}
	out, err := os.ReadFile(outPath)
	if err != nil {
		return sample{}, err
	}
	sum, err := parsePgbenchSummary(string(out))
	if err != nil {
		return sample{}, err
	}
	logs, err := filepath.Glob(prefix + ".*[0-9]")
	if err != nil {
		return sample{}, err
	}
	var latencies []time.Duration
	for _, l := range logs {
		f, err := os.Open(l)
		if err != nil {
			return sample{}, err
		}
		latencies, err = parsePgbenchLog(f, latencies)
		f.Close()
		if err != nil {
			return sample{}, fmt.Errorf("%s: %w", l, err)
		}
	}
	if len(latencies) == 0 {
		return sample{}, fmt.Errorf("pgbench wrote no transaction log at %s.*", prefix)
	}
	conn, err := pgx.Connect(ctx, lt.floorURL)
	if err != nil {
		return sample{}, err
	}
	defer conn.Close(ctx)
	var inFlight int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM idemgate_records WHERE state = 'in_flight'").Scan(&inFlight); err != nil {
		return sample{}, err
	}
	if inFlight > 0 {
		return sample{}, fmt.Errorf("%d floor records are still in flight: the script's Finish UPDATE did not match what its INSERT reserved", inFlight)
	}
	s := pgbenchSample(sum, latencies)
	s.Count *= int64(pairs)
	s.Errors *= int64(pairs)
	s.RPS *= float64(pairs)
	s.CPU = map[cpuRole]time.Duration{roleClient: clientCPU}
	return s, nil
}

// readLoad reads the load average; zero if it cannot.
func readLoad() loadAvg {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return loadAvg{}
	}
	l, _ := parseLoadAvg(string(b))
	return l
}

// cpuModel is the first model name in /proc/cpuinfo, or "".
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// repoRoot finds the directory of this module's go.mod, from the working
// directory up.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module github.com/idemgate/idemgate\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run from inside the idemgate repository (no go.mod of github.com/idemgate/idemgate above the working directory)")
		}
		dir = parent
	}
}

// accounting returns what a row's CPU and writes are read from: the
// payments server it calls, that server's Dedupe service, and the servers
// of the database it writes, when they are the run's own (a shared
// server's CPU and transactions are not this run's alone).
func (lt *loadtest) accounting(id rowID) ([]cpuTarget, []string, error) {
	var pay string
	db := "pg"
	switch id {
	case rowUngated, rowPG1, rowPG16, rowPG64, rowReplay, rowIdlePG:
		pay = lt.pg
	case rowReplayCached:
		pay = lt.pgCached
	case rowAfterReply1, rowAfterReply16, rowAfterReply64:
		pay = lt.pgAfterReply
	case rowInProcess1, rowInProcess64:
		pay = lt.pgInProcess
	case rowNoGC16, rowNoGC64:
		pay = lt.pgNoGC
	case rowPGNoQuota16, rowPGNoQuota64:
		pay = lt.pgNoQuota
	case rowSQLite1, rowSQLite64:
		pay, db = lt.sqlite, ""
	case rowSQLiteInProcess64:
		pay, db = lt.sqliteInProcess, ""
	case rowCitus1, rowCitus16, rowCitus64, rowIdleCitus:
		pay, db = lt.citusPay, "citus"
	case rowCitusNoQuota16, rowCitusNoQuota64:
		pay, db = lt.citusNoQuota, "citus"
	}
	var targets []cpuTarget
	if p, ok := lt.payments[pay]; ok {
		targets = append(targets, cpuTarget{role: roleTool, pid: p.cmd.Process.Pid})
	}
	if d, ok := lt.dedupeOf[pay]; ok {
		targets = append(targets, cpuTarget{role: roleService, pid: d.cmd.Process.Pid})
	}
	var dbs []string
	add := func(role cpuRole, c *pgtest.Cluster) error {
		pid, err := c.PostmasterPID()
		if err != nil {
			return err
		}
		targets = append(targets, cpuTarget{role: role, pid: pid, tree: true})
		dbs = append(dbs, c.URL("postgres"))
		return nil
	}
	switch {
	case db == "pg" && lt.pgServer != nil:
		if err := add(rolePG, lt.pgServer); err != nil {
			return nil, nil, err
		}
	case db == "citus" && lt.citus != nil:
		if err := add(roleCoord, lt.citus.coordinator); err != nil {
			return nil, nil, err
		}
		for i, w := range lt.citus.workers {
			if err := add([]cpuRole{roleWorker1, roleWorker2}[i], w); err != nil {
				return nil, nil, err
			}
		}
	}
	return targets, dbs, nil
}

// checkCitusForms fails unless the Citus stack's Dedupe service logged that
// it runs the store's Citus forms: else the Citus rows would measure a
// store that is not the supported configuration.
func (lt *loadtest) checkCitusForms(stack string) error {
	path := filepath.Join(lt.cfg.results, "dedupesvc-"+stack+".log")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !strings.Contains(string(b), "the store runs its Citus forms") {
		return fmt.Errorf("the Dedupe service on the Citus coordinator did not log that it runs the store's Citus forms (pgstore.WithCitus); see %s", path)
	}
	return nil
}

// measureStorage reads, after the rounds, what the records the gated rows
// stored take: on the PostgreSQL Dedupe service's database (every gated pg
// row's records, stored by the service, with their usage changes) and on
// the Citus workers.
func (lt *loadtest) measureStorage(ctx context.Context) error {
	if lt.runs(rowPG1, rowPG16, rowPG64) {
		fmt.Println("loadtest: measuring the store's size (VACUUM, then VACUUM FULL)")
		st, err := measureStorage(ctx, lt.svcURL)
		if err != nil {
			return fmt.Errorf("storage: %w", err)
		}
		lt.storage = &st
	}
	if lt.citus != nil && lt.runs(citusRows...) {
		var err error
		if lt.citusRecords, lt.citusBytes, err = citusStorage(ctx, lt.citus.coordinator.URL("postgres")); err != nil {
			return fmt.Errorf("storage on Citus: %w", err)
		}
	}
	return nil
}

// writeStorage prints the storage the run measured, per million records.
func (lt *loadtest) writeStorage(w io.Writer) {
	if st := lt.storage; st != nil && st.Records > 0 {
		v, _ := st.perMillion(st.Vacuumed)
		c, _ := st.perMillion(st.Compacted)
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| storage of the gated pg rows' records (their database, every idemgate table with indexes and TOAST) | value |")
		fmt.Fprintln(w, "| --- | ---: |")
		fmt.Fprintf(w, "| completed records | %d |\n", st.Records)
		fmt.Fprintf(w, "| mean outcome (outcome_value) / key bytes | %.1f / %.1f |\n", st.OutcomeBytes, st.KeyBytes)
		fmt.Fprintf(w, "| after VACUUM: bytes, bytes per record, GB per million records | %d, %.0f, %.3f |\n", st.Vacuumed, float64(st.Vacuumed)/float64(st.Records), v)
		fmt.Fprintf(w, "| after VACUUM FULL: bytes, bytes per record, GB per million records | %d, %.0f, %.3f |\n", st.Compacted, float64(st.Compacted)/float64(st.Records), c)
	}
	if lt.citus != nil && lt.citusRecords > 0 {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "| Citus: shards of the idemgate tables per node (citus_shards), %d completed records | bytes | bytes per record of the cluster |\n", lt.citusRecords)
		fmt.Fprintln(w, "| --- | ---: | ---: |")
		for i, wk := range lt.citus.workers {
			b := lt.citusBytes[wk.Port()]
			fmt.Fprintf(w, "| worker %d | %d | %.0f |\n", i+1, b, float64(b)/float64(lt.citusRecords))
		}
	}
}

// citusVersion is the coordinator's citus_version(), or why not.
func citusVersion(ctx context.Context, url string) string {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err.Error()
	}
	defer conn.Close(context.Background())
	var v string
	if err := conn.QueryRow(ctx, "SELECT citus_version()").Scan(&v); err != nil {
		return err.Error()
	}
	v, _, _ = strings.Cut(v, " on ")
	return v
}

// pgConfLines turns -pg-conf's settings, ';' between them, into
// postgresql.conf lines.
func pgConfLines(conf string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(conf, ";") {
		if line = strings.TrimSpace(line); line != "" {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// serviceBegin is the sum of the service's Begin stage means in a row's
// latency budget; 0 without one.
func serviceBegin(budget map[stageKey]time.Duration) time.Duration {
	var d time.Duration
	for k, v := range budget {
		if k.side == "service" && k.rpc == "Begin" {
			d += v
		}
	}
	return d
}

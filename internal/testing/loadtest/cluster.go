package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// The load test runs PostgreSQL servers of its own, started with pgtest's
// pieces (the throwaway clusters the tests use) but durable, as a
// production server is (pgtest.NewDurableClusterConf): each server's
// processes serve this run alone, so the CPU of all of them is what the
// run cost, and Citus needs servers of its own anyway.

// harness lets a program use pgtest, whose functions take a testing.TB:
// a failure panics with harnessFailure, which startCluster turns into an
// error; cleanups run, the last registered first, when close is called.
// Only the methods pgtest calls are implemented; any other panics.
type harness struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

type harnessFailure struct{ msg string }

func (h *harness) Helper() {}

func (h *harness) Fatal(args ...any) { h.fail(fmt.Sprint(args...)) }

func (h *harness) Fatalf(format string, args ...any) { h.fail(fmt.Sprintf(format, args...)) }

func (h *harness) Skip(args ...any) { h.fail(fmt.Sprint(args...)) }

func (h *harness) Skipf(format string, args ...any) { h.fail(fmt.Sprintf(format, args...)) }

func (h *harness) fail(msg string) {
	h.mu.Lock()
	h.failed = true
	h.mu.Unlock()
	panic(harnessFailure{msg})
}

func (h *harness) Errorf(format string, args ...any) {
	h.mu.Lock()
	h.failed = true
	h.mu.Unlock()
	fmt.Fprintf(os.Stderr, "loadtest: "+format+"\n", args...)
}

func (h *harness) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "loadtest: "+format+"\n", args...)
}

func (h *harness) Failed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failed
}

func (h *harness) Cleanup(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cleanups = append(h.cleanups, f)
}

func (h *harness) Name() string { return "loadtest" }

// close runs the cleanups, the last registered first.
func (h *harness) close() {
	h.mu.Lock()
	fs := h.cleanups
	h.cleanups = nil
	h.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		func() {
			defer func() {
				if r := recover(); r != nil {
					fmt.Fprintf(os.Stderr, "loadtest: cleanup: %v\n", r)
				}
			}()
			fs[i]()
		}()
	}
}

// startCluster starts a durable PostgreSQL server with conf appended to
// its postgresql.conf, removed by h.close.
func startCluster(h *harness, conf string) (c *pgtest.Cluster, err error) {
	err = catch(func() { c = pgtest.NewDurableClusterConf(h, conf) })
	return c, err
}

// catch runs f and returns the failure f reported through a harness as an
// error; any other panic goes on.
func catch(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			failure, ok := r.(harnessFailure)
			if !ok {
				panic(r)
			}
			err = errors.New(failure.msg)
		}
	}()
	f()
	return nil
}

// serverConf is every server's configuration beyond the defaults: room
// for the run's connections (two Dedupe services' pools of 16, the
// in-process one's, the floor's 64 pgbench clients, the listeners).
const serverConf = "max_connections = 300\n"

// citusInstalled reports whether citus.so is in the server's library
// directory, and where it looked.
func citusInstalled() (bool, string) {
	lib, err := pgtest.LibDir()
	if err != nil {
		return false, err.Error()
	}
	path := filepath.Join(lib, "citus.so")
	_, err = os.Stat(path)
	return err == nil, path
}

// citusCluster is a coordinator and two workers.
type citusCluster struct {
	coordinator *pgtest.Cluster
	workers     []*pgtest.Cluster
}

// startCitus starts a coordinator and two workers with citus preloaded and
// the shard count Citus defaults to, creates the extension in database
// postgres on each, and registers the nodes: what docs/operating.md says a
// fresh cluster needs, as internal/testing/citustest does.
func startCitus(ctx context.Context, h *harness, pgConf string) (*citusCluster, error) {
	conf := serverConf + pgConf + "shared_preload_libraries = 'citus'\n"
	cc := &citusCluster{}
	var err error
	if cc.coordinator, err = startCluster(h, conf); err != nil {
		return nil, fmt.Errorf("citus coordinator: %w", err)
	}
	for i := range 2 {
		w, err := startCluster(h, conf)
		if err != nil {
			return nil, fmt.Errorf("citus worker %d: %w", i+1, err)
		}
		cc.workers = append(cc.workers, w)
	}
	for _, n := range append([]*pgtest.Cluster{cc.coordinator}, cc.workers...) {
		if err := execOn(ctx, n.URL("postgres"), "CREATE EXTENSION IF NOT EXISTS citus"); err != nil {
			return nil, err
		}
	}
	if err := execOn(ctx, cc.coordinator.URL("postgres"), fmt.Sprintf("SELECT citus_set_coordinator_host('127.0.0.1', %d)", cc.coordinator.Port())); err != nil {
		return nil, err
	}
	for _, w := range cc.workers {
		if err := execOn(ctx, cc.coordinator.URL("postgres"), fmt.Sprintf("SELECT citus_add_node('127.0.0.1', %d)", w.Port())); err != nil {
			return nil, err
		}
	}
	return cc, nil
}

// execOn runs sql on a connection of its own to url.
func execOn(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect %s: %w", redact(url), err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// serverCounts is what one read of a server's write activity gives: the
// transaction ids handed out so far (one per transaction that wrote, so
// one per commit of the store's writes, a batch of group commit being one)
// and the WAL position.
type serverCounts struct {
	xids, wal int64
}

// readCounts reads a server's counts; the query itself takes no
// transaction id.
func readCounts(ctx context.Context, url string) (serverCounts, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return serverCounts{}, err
	}
	defer conn.Close(context.Background())
	var c serverCounts
	err = conn.QueryRow(ctx, `SELECT txid_snapshot_xmax(txid_current_snapshot()), pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&c.xids, &c.wal)
	return c, err
}

// sumCounts reads every server's counts and adds them up.
func sumCounts(ctx context.Context, urls []string) (serverCounts, error) {
	var sum serverCounts
	for _, u := range urls {
		c, err := readCounts(ctx, u)
		if err != nil {
			return serverCounts{}, fmt.Errorf("write counts of %s: %w", redact(u), err)
		}
		sum.xids += c.xids
		sum.wal += c.wal
	}
	return sum, nil
}

// storage is the size of the store's tables on one database after a run.
type storage struct {
	Records      int64   // completed records
	OutcomeBytes float64 // their mean outcome_value size
	KeyBytes     float64 // their mean idempotency_key size
	Vacuumed     int64   // bytes of every idemgate table, index and TOAST after VACUUM
	Compacted    int64   // the same after VACUUM FULL
}

// storageTablesSQL sums the sizes of the store's tables with their indexes
// and TOAST, on plain PostgreSQL.
const storageTablesSQL = `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND c.relname LIKE 'idemgate\_%' AND n.nspname = current_schema()`

// measureStorage reads the size of the store's tables on the database at
// url, after VACUUM and after VACUUM FULL, with the records they hold.
func measureStorage(ctx context.Context, url string) (storage, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return storage{}, err
	}
	defer conn.Close(context.Background())
	var st storage
	if err := conn.QueryRow(ctx, `SELECT count(*), coalesce(avg(octet_length(outcome_value)), 0), coalesce(avg(octet_length(idempotency_key)), 0)
FROM idemgate_records WHERE state = 'completed'`).Scan(&st.Records, &st.OutcomeBytes, &st.KeyBytes); err != nil {
		return storage{}, err
	}
	tables, err := storeTables(ctx, conn)
	if err != nil {
		return storage{}, err
	}
	for _, full := range []bool{false, true} {
		for _, t := range tables {
			verb := "VACUUM (ANALYZE) "
			if full {
				verb = "VACUUM (FULL, ANALYZE) "
			}
			if _, err := conn.Exec(ctx, verb+pgx.Identifier{t}.Sanitize()); err != nil {
				return storage{}, err
			}
		}
		var size int64
		if err := conn.QueryRow(ctx, storageTablesSQL).Scan(&size); err != nil {
			return storage{}, err
		}
		if full {
			st.Compacted = size
		} else {
			st.Vacuumed = size
		}
	}
	return st, nil
}

func storeTables(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND c.relname LIKE 'idemgate\_%' AND n.nspname = current_schema() ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// perMillion is bytes per million records, in GB (10^9 bytes).
func (st storage) perMillion(size int64) (float64, bool) {
	if st.Records <= 0 {
		return 0, false
	}
	return float64(size) / float64(st.Records) * 1e6 / 1e9, true
}

// citusStorage is the bytes the shards of the store's tables take on each
// worker (citus_shards, which also lists the reference tables' copies),
// keyed by port, and the completed records; read on the coordinator.
func citusStorage(ctx context.Context, url string) (records int64, byPort map[int]int64, err error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM idemgate_records WHERE state = 'completed'`).Scan(&records); err != nil {
		return 0, nil, err
	}
	rows, err := conn.Query(ctx, `SELECT nodeport, sum(shard_size)::bigint FROM citus_shards
WHERE table_name::text LIKE 'idemgate\_%' GROUP BY nodeport ORDER BY nodeport`)
	if err != nil {
		return 0, nil, err
	}
	byPort = map[int]int64{}
	for rows.Next() {
		var port int
		var size int64
		if err := rows.Scan(&port, &size); err != nil {
			return 0, nil, err
		}
		byPort[port] = size
	}
	return records, byPort, rows.Err()
}

// parseStores reads -stores: a comma-separated list of postgres and citus.
func parseStores(s string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case "":
		case "postgres", "citus":
			out[f] = true
		default:
			return nil, fmt.Errorf("-stores: %q is not a store; want postgres, citus or both, comma-separated", f)
		}
	}
	if !out["postgres"] {
		return nil, errors.New("-stores: postgres is needed (every row but the Citus ones runs on it)")
	}
	return out, nil
}

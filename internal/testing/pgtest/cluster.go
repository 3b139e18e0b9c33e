package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// clusterTimeout bounds each pg_ctl start and stop. Generous: the machine is
// shared and often loaded, and a start after an immediate stop runs crash
// recovery first.
const clusterTimeout = 120 * time.Second

// clusterDirPrefix names the directories NewCluster makes in os.TempDir(), so
// a later test process can find and reap the ones a killed process left.
const clusterDirPrefix = "idemgate-pgcluster-"

// Cluster is a throwaway PostgreSQL server of one test: its own data
// directory, loopback port and socket directory, so a test may crash or stop
// it without disturbing the shared server other tests use.
type Cluster struct {
	bin  string // directory of initdb, pg_ctl and postgres
	dir  string // everything the cluster made: data, sockets, log
	port int
	// asPostgres runs the server programs as the postgres OS user: initdb and
	// postgres refuse to run as root.
	asPostgres bool
	// durable keeps fsync and full_page_writes on (NewDurableClusterConf).
	durable bool
}

// NewCluster initdbs a fresh cluster into a new temporary directory, starts
// it on a free loopback port and returns it. The server trusts every local
// connection as user postgres. When the test ends it is stopped (immediate)
// and its directory removed, whether or not the test failed.
//
// The binaries are those of the newest /usr/lib/postgresql/<version>/bin,
// else initdb on PATH. Without them the test skips, except under CI=true,
// where it fails. Run as root, the server programs run as the postgres OS
// user through runuser.
func NewCluster(tb testing.TB) *Cluster {
	tb.Helper()
	c := newCluster(tb)
	c.initdb(tb)
	c.startOnFreePort(tb)
	return c
}

// initdb makes the cluster's data directory.
func (c *Cluster) initdb(tb testing.TB) {
	tb.Helper()
	// --no-sync: a test cluster need not survive an OS crash, only a
	// postmaster crash, which loses nothing written to the page cache.
	if out, err := c.run(filepath.Join(c.bin, "initdb"), "-D", c.dataDir(), "--no-sync", "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"); err != nil {
		tb.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
}

// newCluster makes the directory of a cluster, with no data directory yet,
// and registers its removal at the test's end. It skips the test (fails it
// under CI=true) when the server programs cannot run.
func newCluster(tb testing.TB) *Cluster {
	tb.Helper()
	bin, err := postgresBinDir()
	if err != nil {
		unavailable(tb, fmt.Sprintf("pgtest: no PostgreSQL server binaries: %v", err))
	}
	c := &Cluster{bin: bin, asPostgres: os.Geteuid() == 0}
	if c.asPostgres {
		if _, err := user.Lookup("postgres"); err != nil {
			unavailable(tb, fmt.Sprintf("pgtest: running as root needs the postgres OS user to run the server: %v", err))
		}
		if _, err := exec.LookPath("runuser"); err != nil {
			unavailable(tb, fmt.Sprintf("pgtest: running as root needs runuser to run the server as postgres: %v", err))
		}
	}
	reapClusters(tb)

	// Not t.TempDir: the postgres user must be able to reach the directory
	// (t.TempDir's parent is private to root), and a unix socket path must
	// stay under ~100 bytes, which long test names would exceed.
	c.dir, err = os.MkdirTemp("", clusterDirPrefix+"*")
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() { c.remove(tb) })
	// The owner's pid lets reapClusters tell a leftover of a killed test
	// process from a live cluster of a parallel one.
	if err := os.WriteFile(filepath.Join(c.dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if err := os.Mkdir(filepath.Join(c.dir, "socket"), 0o755); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if c.asPostgres {
		if err := chownTree(c.dir, "postgres"); err != nil {
			tb.Fatalf("pgtest: %v", err)
		}
	}
	return c
}

// startOnFreePort starts the server on a free loopback port. A free port can
// be taken between our probe and the server's bind by a parallel test; it
// tries a few.
func (c *Cluster) startOnFreePort(tb testing.TB) {
	tb.Helper()
	for attempt := 1; ; attempt++ {
		c.port = freePort(tb)
		_ = os.Remove(c.logFile()) // so "could not bind" below is this attempt's
		err := c.start()
		if err == nil {
			return
		}
		if attempt == 3 || !strings.Contains(c.serverLog(), "could not bind") {
			tb.Fatalf("pgtest: start cluster on port %d: %v\n%s", c.port, err, c.serverLog())
		}
	}
}

// URL returns the URL of database on the cluster, as user postgres without
// TLS; "postgres" is the database initdb creates.
func (c *Cluster) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, database)
}

// Port returns the cluster's loopback TCP port; it never changes.
func (c *Cluster) Port() int { return c.port }

// Stop stops the server with pg_ctl's mode: "immediate" kills it without a
// checkpoint, as a crash would (the next Start runs crash recovery), and
// "fast" disconnects clients and shuts down cleanly. It returns once the
// server has exited.
func (c *Cluster) Stop(tb testing.TB, mode string) {
	tb.Helper()
	if mode != "immediate" && mode != "fast" {
		tb.Fatalf("pgtest: Stop mode %q: want immediate or fast", mode)
	}
	if out, err := c.pgCtl("stop", "-m", mode); err != nil {
		tb.Fatalf("pgtest: pg_ctl stop -m %s: %v\n%s\n%s", mode, err, out, c.serverLog())
	}
}

// Kill kills the server as kill -9 (or the kernel's OOM killer) would: the
// postmaster is stopped first, so it forks no more, then it and every
// process it started get SIGKILL, with no shutdown at all, not even the
// quit signal an immediate stop sends the backends. It returns once they
// have all exited (its lock files removed); the next Start runs crash
// recovery.
func (c *Cluster) Kill(tb testing.TB) {
	tb.Helper()
	pid, err := postmasterPID(c.dataDir())
	if err != nil {
		tb.Fatalf("pgtest: kill cluster on port %d: %v", c.port, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		tb.Fatalf("pgtest: kill cluster on port %d: stop postmaster %d: %v", c.port, pid, err)
	}
	// Each backend leads a process group of its own, so the postmaster's
	// group is not all of them: find them by their parent.
	procs := append(childrenOf(pid), pid)
	for _, p := range procs {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	deadline := time.Now().Add(clusterTimeout)
	for _, p := range procs {
		for alive(p) {
			if time.Now().After(deadline) {
				tb.Fatalf("pgtest: kill cluster on port %d: process %d still runs after SIGKILL", c.port, p)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The lock files stay behind, naming a pid that may linger as a zombie
	// nobody reaps (a container's first process may not): pg_ctl would
	// think the server runs, and the next postmaster would refuse to start.
	// Every process of the server is gone, so it names no live server.
	socket := filepath.Join(c.dir, "socket", fmt.Sprintf(".s.PGSQL.%d", c.port))
	for _, f := range []string{filepath.Join(c.dataDir(), "postmaster.pid"), socket + ".lock", socket} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			tb.Fatalf("pgtest: kill cluster on port %d: %v", c.port, err)
		}
	}
}

// childrenOf returns the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, ok := procStat(p); ok && ppid == pid {
			out = append(out, p)
		}
	}
	return out
}

// alive reports whether process pid exists and is no zombie (a container's
// first process may never reap the orphans it inherits).
func alive(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != 'Z' && state != 'X'
}

// procStat reads a process's parent and state from /proc/<pid>/stat.
func procStat(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0][0], err == nil
}

// Start starts the stopped server again on the same port and data directory
// and returns once it accepts connections.
func (c *Cluster) Start(tb testing.TB) {
	tb.Helper()
	if err := c.start(); err != nil {
		tb.Fatalf("pgtest: start cluster on port %d: %v\n%s", c.port, err, c.serverLog())
	}
}

// Running reports whether the server is running (pg_ctl status).
func (c *Cluster) Running() bool {
	_, err := c.pgCtl("status")
	return err == nil
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }
func (c *Cluster) logFile() string { return filepath.Join(c.dir, "server.log") }

// start runs the server and waits until it accepts a connection on its TCP
// port, which pg_ctl -w alone does not promise for the TCP socket.
func (c *Cluster) start() error {
	// fsync=off and full_page_writes=off: tests crash the postmaster, never
	// the OS, so what was written to the page cache survives and syncing it
	// only costs time. synchronous_commit stays on: off, a commit could still
	// sit in the server's WAL buffers when an immediate stop kills it.
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", c.port, filepath.Join(c.dir, "socket"))
	if !c.durable {
		opts += " -c fsync=off -c full_page_writes=off"
	}
	if out, err := c.pgCtl("start", "-l", c.logFile(), "-o", opts); err != nil {
		return fmt.Errorf("pg_ctl start: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server does not accept connections: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) pgCtl(args ...string) ([]byte, error) {
	args = append([]string{"-D", c.dataDir(), "-w", "-t", strconv.Itoa(int(clusterTimeout.Seconds()))}, args...)
	return c.run(filepath.Join(c.bin, "pg_ctl"), args...)
}

// run runs a server program, as the postgres OS user when we are root.
func (c *Cluster) run(prog string, args ...string) ([]byte, error) {
	return runServerProgram(c.dir, c.asPostgres, prog, args...)
}

func runServerProgram(dir string, asPostgres bool, prog string, args ...string) ([]byte, error) {
	if asPostgres {
		args = append([]string{"-u", "postgres", "--", prog}, args...)
		prog = "runuser"
	}
	cmd := exec.Command(prog, args...)
	// The test's working directory may be closed to the postgres user.
	cmd.Dir = dir
	// Safe with pg_ctl start: with -l, the server's output goes to the log
	// file, so the server does not hold this pipe open.
	return cmd.CombinedOutput()
}

func (c *Cluster) serverLog() string {
	b, err := os.ReadFile(c.logFile())
	if err != nil {
		return fmt.Sprintf("(no server log: %v)", err)
	}
	return string(b)
}

// remove stops the server if it runs and deletes the cluster's directory; the
// server log goes to the test log first when the test failed.
func (c *Cluster) remove(tb testing.TB) {
	if tb.Failed() {
		tb.Logf("pgtest: server log of the cluster on port %d:\n%s", c.port, c.serverLog())
	}
	if c.Running() {
		if out, err := c.pgCtl("stop", "-m", "immediate"); err != nil {
			tb.Errorf("pgtest: stop cluster on port %d: %v\n%s", c.port, err, out)
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		tb.Errorf("pgtest: %v", err)
	}
}

// reapMu keeps a test process's parallel NewCluster calls from reaping the
// same leftover twice.
var reapMu sync.Mutex

// reapClusters stops and removes clusters whose test process is gone: one
// killed by a test timeout runs no cleanup and would leave its server running.
func reapClusters(tb testing.TB) {
	reapMu.Lock()
	defer reapMu.Unlock()
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), clusterDirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue // not a cluster directory, or one still being made
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil || pid == os.Getpid() || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue // unreadable, ours, or its process is alive
		}
		bin, err := postgresBinDir()
		if err != nil {
			return
		}
		if _, err := os.Stat(filepath.Join(dir, "data", "postmaster.pid")); err == nil {
			_, _ = runServerProgram(dir, os.Geteuid() == 0, filepath.Join(bin, "pg_ctl"), "-D", filepath.Join(dir, "data"), "-w", "-t", "60", "stop", "-m", "immediate")
		}
		if err := os.RemoveAll(dir); err == nil {
			tb.Logf("pgtest: removed the cluster %s left by test process %d", dir, pid)
		}
	}
}

// postgresBinDir returns the newest /usr/lib/postgresql/<version>/bin (the
// Debian layout), else the directory of initdb on PATH.
func postgresBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	var versions []int
	for _, d := range dirs {
		if v, err := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(d)))); err == nil {
			versions = append(versions, v)
		}
	}
	if len(versions) > 0 {
		sort.Ints(versions)
		return filepath.Join("/usr/lib/postgresql", strconv.Itoa(versions[len(versions)-1]), "bin"), nil
	}
	initdb, err := exec.LookPath("initdb")
	if err != nil {
		return "", fmt.Errorf("none in /usr/lib/postgresql/*/bin, and %w", err)
	}
	return filepath.Dir(initdb), nil
}

// chownTree gives dir and everything in it to the OS user name.
func chownTree(dir, name string) error {
	u, err := user.Lookup(name)
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(tb testing.TB) int {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	defer lis.Close()
	return lis.Addr().(*net.TCPAddr).Port
}

// unavailable skips the test, or fails it under CI=true, where a test must
// never pass by skipping the store.
func unavailable(tb testing.TB, msg string) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
}

// EnableTLS installs certPEM and keyPEM as the server's certificate and key
// and turns ssl on (a reload), so clients may connect with sslmode=require
// or verify-full; plaintext connections are still accepted.
func (c *Cluster) EnableTLS(tb testing.TB, certPEM, keyPEM []byte) {
	tb.Helper()
	for name, data := range map[string][]byte{"server.crt": certPEM, "server.key": keyPEM} {
		path := filepath.Join(c.dataDir(), name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			tb.Fatalf("pgtest: %v", err)
		}
		if c.asPostgres {
			if err := chownTree(path, "postgres"); err != nil {
				tb.Fatalf("pgtest: %v", err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	defer conn.Close(ctx)
	for _, stmt := range []string{"ALTER SYSTEM SET ssl = on", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			tb.Fatalf("pgtest: %s: %v", stmt, err)
		}
	}
}

// NewClusterConf is NewCluster with conf appended to the cluster's
// postgresql.conf before its first start, for settings a running server
// cannot take (shared_preload_libraries).
func NewClusterConf(tb testing.TB, conf string) *Cluster {
	tb.Helper()
	c := newCluster(tb)
	c.initdb(tb)
	appendConf(tb, c, conf)
	c.startOnFreePort(tb)
	return c
}

// NewDurableClusterConf is NewClusterConf for a benchmark: the server
// keeps fsync and full_page_writes on, as PostgreSQL's defaults have them,
// so a commit costs what it costs a production server (NewCluster turns
// both off, which only tests that crash the postmaster can afford).
func NewDurableClusterConf(tb testing.TB, conf string) *Cluster {
	tb.Helper()
	c := newCluster(tb)
	c.durable = true
	c.initdb(tb)
	appendConf(tb, c, conf)
	c.startOnFreePort(tb)
	return c
}

// PostmasterPID returns the process id of the running server's postmaster
// (the first line of its postmaster.pid), whose children are its backends
// and background processes.
func (c *Cluster) PostmasterPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(c.dataDir(), "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgtest: the server's pid: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0, fmt.Errorf("pgtest: postmaster.pid: %w", err)
	}
	return pid, nil
}

// LibDir returns the directory of the server's extension libraries (the
// lib beside the bin of the binaries NewCluster runs), for tests that
// need an extension installed there.
func LibDir() (string, error) {
	bin, err := postgresBinDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(bin), "lib"), nil
}

// refusingTCP is prepended to pg_hba.conf by RefuseTCP: every TCP
// connection rejected, the unix socket's lines left as they were.
const refusingTCP = "host all all 0.0.0.0/0 reject\nhost all all ::/0 reject\n"

// RefuseTCP makes the running server look cut off by the network to its
// TCP clients without restarting it (so pg_postmaster_start_time() stays):
// pg_hba.conf rejects every new TCP connection (a reload), and every client
// backend is ended, so no open connection gets through either. Background
// workers keep running; AcceptTCP undoes it. It returns once a TCP
// connection is refused.
func (c *Cluster) RefuseTCP(tb testing.TB) {
	tb.Helper()
	hba := filepath.Join(c.dataDir(), "pg_hba.conf")
	conf, err := os.ReadFile(hba)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if !strings.HasPrefix(string(conf), refusingTCP) {
		// WriteFile on the existing file keeps its owner (postgres).
		if err := os.WriteFile(hba, append([]byte(refusingTCP), conf...), 0o600); err != nil {
			tb.Fatalf("pgtest: %v", err)
		}
	}
	c.reloadUntil(tb, false)
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	// Over the unix socket, which pg_hba.conf still trusts.
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@/postgres?host=%s&port=%d&sslmode=disable", filepath.Join(c.dir, "socket"), c.port))
	if err != nil {
		tb.Fatalf("pgtest: connect over the unix socket: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`); err != nil {
		tb.Fatalf("pgtest: end the client backends: %v", err)
	}
}

// AcceptTCP undoes RefuseTCP: pg_hba.conf as it was, reloaded. It returns
// once a TCP connection is accepted.
func (c *Cluster) AcceptTCP(tb testing.TB) {
	tb.Helper()
	hba := filepath.Join(c.dataDir(), "pg_hba.conf")
	conf, err := os.ReadFile(hba)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if err := os.WriteFile(hba, []byte(strings.TrimPrefix(string(conf), refusingTCP)), 0o600); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	c.reloadUntil(tb, true)
}

// reloadUntil reloads the server's configuration (pg_ctl reload, which only
// signals it) and waits until a TCP connection is accepted (accept) or
// refused (!accept).
func (c *Cluster) reloadUntil(tb testing.TB, accept bool) {
	tb.Helper()
	if out, err := c.pgCtl("reload"); err != nil {
		tb.Fatalf("pgtest: pg_ctl reload: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			conn.Close(ctx)
		}
		if ctx.Err() == nil && (err == nil) == accept {
			return
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("pgtest: the server on port %d still %s TCP connections after a reload", c.port, map[bool]string{true: "refuses", false: "accepts"}[accept])
		case <-time.After(50 * time.Millisecond):
		}
	}
}

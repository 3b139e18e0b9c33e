package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/gobuild"
	"github.com/idemgate/idemgate/internal/testing/citustest"
	"github.com/idemgate/idemgate/internal/testing/netfault"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
)

var (
	chaosFlag = flag.Bool("chaos", false, "run the chaos suite (make chaos); off by default, so go test ./... stays quick; any -chaos.* flag turns it on too")
	seedFlag  = flag.Uint64("chaos.seed", 0, "seed of the workload and the fault schedule; 0 picks one from the clock")
	longFlag  = flag.Bool("chaos.long", false, "ten times the actions and outages of the default short run")
	keepFlag  = flag.Bool("chaos.keep", false, "keep the run directory even when every scenario passes")
)

// patience bounds a wait for something that must happen (a process to
// listen, a cluster to start); generous, as the machine is shared.
const patience = 2 * time.Minute

// chaosRequested reports whether -chaos or any -chaos.* flag was given.
func chaosRequested() bool {
	requested := *chaosFlag
	flag.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "chaos.") {
			requested = true
		}
	})
	return requested
}

// binaries are the real programs under test, built once per run.
type binaries struct{ dedupesvc, tool, workload string }

// suite is one run: its seed, size, directory and the shared cluster.
type suite struct {
	ctx     context.Context
	seed    uint64
	long    bool
	dir     string
	bins    binaries
	cluster *pgtest.Cluster
	mu      sync.Mutex
	dbs     int
	reports []*Report
}

// TestChaos runs every scenario against the real binaries and fails when the
// checker finds a violation, or finds none where a scenario expects some.
// Scenarios run in parallel (go test's -parallel); each has its own
// processes, ports and database or data directory.
func TestChaos(t *testing.T) {
	if !chaosRequested() {
		t.Skip("the chaos suite runs with -chaos or any -chaos.* flag: make chaos")
	}
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano()%1_000_000) + 1
	}
	// Ctrl-C or SIGTERM ends every wait, so the test fails and its cleanups
	// kill the processes and remove the cluster instead of leaving them.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	t.Cleanup(stop)
	dir, err := os.MkdirTemp("", "idemgate-chaos-*")
	if err != nil {
		t.Fatal(err)
	}
	s := &suite{ctx: ctx, seed: seed, long: *longFlag, dir: dir}
	reproduce := fmt.Sprintf("make chaos SEED=%d", seed)
	if s.long {
		reproduce += " LONG=1"
	}
	t.Logf("chaos: seed %d, long %t, run directory %s; reproduce with: %s", seed, s.long, dir, reproduce)
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		var summary strings.Builder
		for _, r := range s.reports {
			summary.WriteString(r.String())
		}
		_ = os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(summary.String()), 0o644)
		t.Logf("chaos summary (seed %d):\n%s", seed, summary.String())
		if t.Failed() || *keepFlag {
			t.Logf("chaos: logs, histories, ledgers and reports kept in %s; reproduce with: %s", dir, reproduce)
			return
		}
		_ = os.RemoveAll(dir)
	})
	if os.Getenv(brokenGateEnv) == "1" {
		// proctest passes the environment on: every tool server breaks.
		t.Logf("chaos: %s=1 is set, so every tool server runs the broken layer; expect the checker to fail the scenarios", brokenGateEnv)
	}
	s.bins = buildAll(t)
	s.cluster = pgtest.NewCluster(t)
	for _, sc := range scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			// A parallel subtest waits until every sequential one has run.
			if !sc.Alone {
				t.Parallel()
			}
			s.run(t, sc)
		})
	}
}

// buildAll builds the three binaries into a directory removed when the run
// ends.
func buildAll(t *testing.T) binaries {
	dir := t.TempDir()
	pkgs := map[string]*string{}
	var b binaries
	pkgs["github.com/idemgate/idemgate/cmd/dedupesvc"] = &b.dedupesvc
	pkgs["github.com/idemgate/idemgate/internal/testing/chaos/cmd/chaos-tool"] = &b.tool
	pkgs["github.com/idemgate/idemgate/internal/testing/chaos/cmd/chaos-workload"] = &b.workload
	var wg sync.WaitGroup
	errs := make([]error, 0, len(pkgs))
	var mu sync.Mutex
	for pkg, into := range pkgs {
		*into = filepath.Join(dir, filepath.Base(pkg))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := gobuild.Build(context.Background(), "", "", "-o", *into, pkg); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return b
}

// newDatabase creates a database of its own on the shared cluster.
func (s *suite) newDatabase(t *testing.T, cluster *pgtest.Cluster) string {
	s.mu.Lock()
	s.dbs++
	name := fmt.Sprintf("chaos_%d", s.dbs)
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.ctx, patience)
	defer cancel()
	conn, err := pgx.Connect(ctx, cluster.URL("postgres"))
	if err != nil {
		t.Fatalf("connect to the cluster: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	return cluster.URL(name)
}

// run runs one scenario and checks it.
func (s *suite) run(t *testing.T, sc Scenario) {
	dir := filepath.Join(s.dir, strings.ReplaceAll(sc.Name, "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	st := &Stack{t: t, s: s, sc: sc, dir: dir, ctx: s.ctx}
	switch sc.Store {
	case StorePostgres:
		st.Cluster = s.cluster
		if sc.OwnCluster {
			st.Cluster = pgtest.NewCluster(t)
		}
		st.DatabaseURL = s.newDatabase(t, st.Cluster)
	case StoreCitus:
		citusStore(st, sc.CitusShards)
	case StoreSQLite:
		st.DataDir = filepath.Join(dir, "sqlite")
	default:
		t.Fatalf("scenario %s: unknown store %q", sc.Name, sc.Store)
	}
	for i := range max(1, sc.Replicas) {
		st.Dedupes = append(st.Dedupes, &Member{Name: fmt.Sprintf("dedupe%d", i), Addr: listenAddr(t)})
	}
	for i := range max(1, sc.Tools) {
		st.Tools = append(st.Tools, &Member{Name: fmt.Sprintf("tool%d", i), Addr: listenAddr(t),
			DedupeAddr: st.Dedupes[i%len(st.Dedupes)].Addr, Ledger: filepath.Join(dir, fmt.Sprintf("ledger-tool%d.jsonl", i))})
		switch sc.Transport {
		case TransportHTTP:
			st.Tools[i].HTTPAddr = listenAddr(t)
		case TransportConnect:
			st.Tools[i].ConnectAddr = listenAddr(t)
		}
	}
	if sc.Setup != nil {
		sc.Setup(st)
	}
	for _, d := range st.Dedupes {
		st.startDedupe(d)
	}
	for _, tool := range st.Tools {
		st.startTool(tool)
	}

	scale := 1
	if s.long {
		scale = 10
	}
	w := sc.Workload
	if w.TryTimeout == 0 {
		w.TryTimeout = 10 * time.Second
	}
	if w.Spread == 0 {
		w.Spread = 20 * time.Second
	}
	if w.Actions == 0 {
		w.Actions = 30
	}
	if w.Callers == 0 {
		w.Callers = 3
	}
	actions, spread := w.Actions*scale, time.Duration(scale)*w.Spread
	outages := sc.Outages * scale
	history := filepath.Join(dir, "history.jsonl")
	targets := make([]string, len(st.Tools))
	for i, tool := range st.Tools {
		targets[i] = tool.Addr
		if tool.CallerAddr != "" {
			targets[i] = tool.CallerAddr
		}
		switch sc.Transport {
		case TransportHTTP:
			targets[i] = tool.HTTPAddr
		case TransportConnect:
			targets[i] = tool.ConnectAddr
		}
	}
	args := []string{"-targets", strings.Join(targets, ","), "-history", history, "-seed", strconv.FormatUint(s.seed^hash(sc.Name), 10),
		"-actions", strconv.Itoa(actions), "-spread", spread.String(), "-callers", strconv.Itoa(w.Callers),
		"-reexecute", fmt.Sprint(w.Reexecute), "-pause", fmt.Sprint(w.Pause), "-ambiguous", fmt.Sprint(w.Ambiguous), "-try-timeout", w.TryTimeout.String()}
	if sc.Transport != "" && sc.Transport != TransportGRPC {
		args = append(args, "-transport", sc.Transport)
	}
	if w.Concurrency > 0 {
		args = append(args, "-concurrency", strconv.Itoa(w.Concurrency))
	}
	if w.AmbiguousFailClosed > 0 {
		args = append(args, "-ambiguous-fail-closed", strconv.Itoa(w.AmbiguousFailClosed*scale))
	}
	if w.FirstToolFirst {
		args = append(args, "-first-target", "0")
	}
	if w.DuplicatesAfter > 0 {
		args = append(args, "-duplicates-after", w.DuplicatesAfter.String())
	}
	if w.LateMetadata > 0 {
		var ledgers []string
		for _, tool := range st.Tools {
			ledgers = append(ledgers, tool.Ledger)
		}
		args = append(args, "-late-metadata", fmt.Sprint(w.LateMetadata), "-ledgers", strings.Join(ledgers, ","))
	}
	start := time.Now()
	workload := proctest.Start(t, s.bins.workload, args, nil)
	st.keepLog(workload, "workload")
	done := make(chan struct{})
	go func() { _ = workload.Wait(time.Hour); close(done) }()
	background := make(chan error, 1)
	if sc.Background != nil {
		go func() { background <- sc.Background(st, done) }()
	} else {
		background <- nil
	}

	for i := 0; i < outages && sc.Fault != nil; i++ {
		if !st.sleep(time.Second) {
			break
		}
		select {
		case <-done:
			t.Logf("the workload ended after %d of %d outages", i, outages)
			i = outages
			continue
		default:
		}
		if err := sc.Fault(st, done); err != nil {
			t.Fatalf("fault %d of %s: %v", i+1, sc.Name, err)
		}
	}
	select {
	case <-done:
	case <-s.ctx.Done():
		t.Fatal("interrupted")
	case <-time.After(spread + 4*time.Minute):
		t.Fatal("the workload did not end; its log follows the test")
	}
	if err := workload.Wait(0); err != nil {
		t.Fatalf("the workload failed: %v\n%s", err, workload.Log())
	}
	if err := <-background; err != nil {
		t.Fatalf("%s: %v", sc.Name, err)
	}
	t.Logf("workload done in %s", time.Since(start).Round(time.Second))

	attempts, err := ReadHistory(history)
	if err != nil {
		t.Fatal(err)
	}
	var ledgers []string
	for _, tool := range st.Tools {
		ledgers = append(ledgers, tool.Ledger)
	}
	entries, torn, err := ReadLedger(ledgers...)
	if err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	windows := append([]Outage(nil), st.outages...)
	holders := append([]HolderFault(nil), st.holderFaults...)
	st.mu.Unlock()
	report := Check(sc.Name, s.seed, attempts, entries, torn, windows, holders, sc.Rules)
	report.RequireReasons(sc.MustSee...)
	if sc.Spared > 0 {
		report.RequireSpared(sc.Spared, sc.SparedTries)
	}
	if sc.RecoverWithin > 0 {
		report.RequireRecovered(sc.RecoverWithin)
	}
	_ = os.WriteFile(filepath.Join(dir, "report.txt"), []byte(report.String()), 0o644)
	s.mu.Lock()
	s.reports = append(s.reports, report)
	s.mu.Unlock()
	t.Log("\n" + report.String())
	switch {
	case sc.ExpectViolations && !report.Failed():
		t.Errorf("%s is built to break a guarantee, but the checker found no violation: the checker is blind to it", sc.Name)
	case !sc.ExpectViolations && report.Failed():
		t.Errorf("%s: %d violations; history, ledgers and logs in %s", sc.Name, len(report.Violations), dir)
	}
}

func hash(s string) uint64 {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// Member is one process of the stack: a Dedupe replica or a tool server.
type Member struct {
	// Name names it in logs and the ledger; Addr is where it listens.
	Name, Addr string
	// DedupeAddr is the Dedupe address a tool server dials (a Setup hook may
	// point it at a proxy); Ledger is a tool server's ledger file.
	DedupeAddr, Ledger string
	// CallerAddr is the address the workload dials for a tool server; empty
	// means Addr. A Setup hook points it at a proxy. It applies to the gRPC
	// transport only.
	CallerAddr string
	// HTTPAddr is where a tool server serves HTTP (chaos-tool
	// -http-listen), which the workload dials in a scenario of
	// TransportHTTP; empty in the others. ConnectAddr is the same for
	// Connect (chaos-tool -connect-listen, TransportConnect).
	HTTPAddr, ConnectAddr string
	// ToolArgs are extra chaos-tool flags for a tool server; a Setup hook
	// sets them.
	ToolArgs []string
	// CallerProxy and DedupeProxy are a tool server's proxies from its
	// callers and to its Dedupe replica; nil unless a Setup hook put them
	// there.
	CallerProxy, DedupeProxy *netfault.Proxy
	proc                     *proctest.Process
	mu                       sync.Mutex
}

func (m *Member) process() *proctest.Process {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.proc
}

// Stack is one scenario's running system, and the faults it can suffer.
type Stack struct {
	t   *testing.T
	s   *suite
	sc  Scenario
	dir string
	ctx context.Context
	// Cluster is the PostgreSQL cluster (StorePostgres); DatabaseURL what the
	// Dedupe replicas connect to, which a Setup hook may replace (a proxy, a
	// failover pair). DataDir is the embedded store's directory.
	Cluster     *pgtest.Cluster
	DatabaseURL string
	// Replicated is the primary and standby a failover scenario's Setup
	// started, nil otherwise; failedOver is set once the standby is promoted.
	Replicated *pgtest.Replicated
	failedOver bool
	// Patroni is the Patroni cluster a high-availability scenario's Setup
	// started, nil otherwise; patroniFaults counts the faults it suffered.
	Patroni       *pgtest.Patroni
	patroniFaults int
	// Citus is the Citus cluster of a StoreCitus scenario, CitusSchema the
	// schema the Dedupe replicas' URL selects on its coordinator.
	Citus       *citustest.Cluster
	CitusSchema string
	// DedupeFlags are more flags for every Dedupe replica.
	DedupeFlags []string
	DataDir     string
	// Dedupes and Tools are the processes; Setup may change their addresses
	// before they start.
	Dedupes, Tools []*Member
	mu             sync.Mutex
	outages        []Outage
	holderFaults   []HolderFault
	logs           int
}

// T is the scenario's test.
func (st *Stack) T() *testing.T { return st.t }

// keepLog copies p's log into the scenario directory when the scenario ends,
// before proctest's own cleanup kills p.
func (st *Stack) keepLog(p *proctest.Process, name string) {
	st.mu.Lock()
	st.logs++
	path := filepath.Join(st.dir, fmt.Sprintf("%s-%d.log", name, st.logs))
	st.mu.Unlock()
	st.t.Cleanup(func() { _ = os.WriteFile(path, []byte(p.Log()), 0o644) })
}

func (st *Stack) startDedupe(m *Member) {
	args := []string{"-listen", m.Addr, "-metrics-listen="}
	if st.DatabaseURL != "" {
		args = append(args, "-database-url", st.DatabaseURL)
	} else {
		args = append(args, "-database-url=", "-data-dir", st.DataDir)
	}
	args = append(args, st.DedupeFlags...)
	p := proctest.Start(st.t, st.s.bins.dedupesvc, args, nil)
	st.keepLog(p, m.Name)
	p.WaitTCP(st.t, m.Addr, patience)
	m.mu.Lock()
	m.proc = p
	m.mu.Unlock()
}

func (st *Stack) startTool(m *Member) {
	args := []string{"-listen", m.Addr, "-dedupe", m.DedupeAddr, "-ledger", m.Ledger, "-name", m.Name,
		"-pause-keys", `-p(-a)?$`, "-pause-for", "3s", "-ambiguous-keys", `-a$`, "-late-metadata-keys", LateMetadataSuffix + "$"}
	if m.HTTPAddr != "" {
		args = append(args, "-http-listen", m.HTTPAddr)
	}
	if m.ConnectAddr != "" {
		args = append(args, "-connect-listen", m.ConnectAddr)
	}
	args = append(args, m.ToolArgs...)
	var env []string
	if st.sc.Broken {
		env = append(env, brokenGateEnv+"=1")
	}
	p := proctest.Start(st.t, st.s.bins.tool, args, env)
	st.keepLog(p, m.Name)
	p.WaitTCP(st.t, m.Addr, patience)
	if m.HTTPAddr != "" {
		p.WaitTCP(st.t, m.HTTPAddr, patience)
	}
	if m.ConnectAddr != "" {
		p.WaitTCP(st.t, m.ConnectAddr, patience)
	}
	m.mu.Lock()
	m.proc = p
	m.mu.Unlock()
}

// brokenGateEnv is chaos-tool's switch for its broken layer.
const brokenGateEnv = "IDEMGATE_CHAOS_BROKEN_GATE"

// sleep waits d, or reports false when the run is interrupted.
func (st *Stack) sleep(d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-st.ctx.Done():
		return false
	}
}

// outage records a window in which the store was away from servers (all
// when none are named).
func (st *Stack) outage(what string, start, end time.Time, servers ...string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.outages = append(st.outages, Outage{What: what, Start: start, End: end, Servers: servers})
}

// errNoPause is returned when no handler reached the pause point before the
// workload ended: the fault is skipped, which the log says.
var errNoPause = errors.New("no handler reached the pause point")

// AtPausePoint waits until a handler of method (any, when "") on one of
// tools (any, when none are given) is stalled between its side effect and
// its return, and returns that tool. It gives up with errNoPause when the
// workload ends first.
func (st *Stack) AtPausePoint(done <-chan struct{}, method string, tools ...*Member) (*Member, error) {
	m, _, err := st.PausedKey(done, method, tools...)
	return m, err
}

// PausedKey is AtPausePoint that also returns the idempotency key of the
// handler at the pause point.
func (st *Stack) PausedKey(done <-chan struct{}, method string, tools ...*Member) (*Member, string, error) {
	if len(tools) == 0 {
		tools = st.Tools
	}
	type cursor struct {
		off int64
		pid int
	}
	cursors := make([]cursor, len(tools))
	for i, m := range tools {
		cursors[i] = cursor{off: fileSize(m.Ledger), pid: m.process().Pid()}
	}
	for {
		for i, m := range tools {
			var key string
			cursors[i].off, key = scanForPause(m.Ledger, cursors[i].off, cursors[i].pid, method)
			if key != "" {
				return m, key, nil
			}
		}
		select {
		case <-done:
			return nil, "", errNoPause
		case <-st.ctx.Done():
			return nil, "", errors.New("interrupted")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// scanForPause reads whole ledger lines from off and returns the key of the
// first that is the side effect of a pausing key by pid (of method, unless
// ""), "" if none is, and the offset after the lines read.
func scanForPause(path string, off int64, pid int, method string) (int64, string) {
	f, err := os.Open(path)
	if err != nil {
		return off, ""
	}
	defer f.Close()
	if _, err := f.Seek(off, 0); err != nil {
		return off, ""
	}
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return off, "" // a partial line is read again next time
		}
		off += int64(len(line))
		var e LedgerEntry
		if json.Unmarshal(line, &e) == nil && e.Event == EventEffect && e.Pid == pid && strings.Contains(e.Key, "-p") && (method == "" || e.Method == method) {
			return off, e.Key
		}
	}
}

// KillTool SIGKILLs a tool server and starts it again on the same address
// and ledger.
func (st *Stack) KillTool(m *Member) {
	at := time.Now()
	m.process().Kill()
	st.holderFault("killed "+m.Name, m, at, time.Now())
	st.t.Logf("killed %s", m.Name)
	st.startTool(m)
}

// StallTool SIGSTOPs a tool server for d, then SIGCONTs it.
func (st *Stack) StallTool(m *Member, d time.Duration) error {
	p := m.process()
	start := time.Now()
	if err := p.Pause(); err != nil {
		return err
	}
	st.t.Logf("stopped %s for %s", m.Name, d)
	st.sleep(d)
	err := p.Resume()
	st.holderFault("stopped "+m.Name, m, start, time.Now())
	return err
}

// holderFault records that tool server m was killed or stopped from start
// to end, for the checker (HolderFault).
func (st *Stack) holderFault(what string, m *Member, start, end time.Time) {
	targets := []string{m.Addr}
	if m.CallerAddr != "" {
		targets = append(targets, m.CallerAddr)
	}
	if m.HTTPAddr != "" {
		targets = append(targets, m.HTTPAddr)
	}
	if m.ConnectAddr != "" {
		targets = append(targets, m.ConnectAddr)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.holderFaults = append(st.holderFaults, HolderFault{What: what, Targets: targets, Start: start, End: end})
}

// KillDedupe SIGKILLs a Dedupe replica, keeps it down for d and starts it
// again; the tool servers that dial it saw their store go away.
func (st *Stack) KillDedupe(m *Member, d time.Duration) {
	m.process().Kill()
	downAt := time.Now()
	st.t.Logf("killed %s for %s", m.Name, d)
	st.sleep(d)
	upAt := time.Now()
	st.startDedupe(m)
	var servers []string
	for _, tool := range st.Tools {
		if tool.DedupeAddr == m.Addr {
			servers = append(servers, tool.Name)
		}
	}
	st.outage("dedupe replica "+m.Name+" killed", downAt, upAt, servers...)
}

// CrashPostgres stops the cluster with pg_ctl -m immediate, keeps it down
// for d and starts it again (crash recovery runs first).
func (st *Stack) CrashPostgres(d time.Duration) {
	st.Cluster.Stop(st.t, "immediate")
	downAt := time.Now()
	st.t.Logf("PostgreSQL stopped -m immediate for %s", d)
	st.sleep(d)
	upAt := time.Now()
	st.Cluster.Start(st.t)
	st.outage("PostgreSQL stopped -m immediate", downAt, upAt)
}

// listenPorts hands out the suite's listen ports: each once per run, from a
// random point below the ephemeral range, so a port between its pick and
// its process's bind is not taken by an outgoing connection (which draw
// from that range), and two suites on one machine rarely meet.
var listenPorts struct {
	sync.Mutex
	next int
}

// minListenPort is the lowest port listenAddr hands out.
const minListenPort = 10000

// listenAddr returns a loopback address on a port below the ephemeral range
// that nothing listens on now, each once per run.
func listenAddr(t *testing.T) string {
	t.Helper()
	lo := ephemeralLow()
	listenPorts.Lock()
	defer listenPorts.Unlock()
	if listenPorts.next == 0 {
		listenPorts.next = minListenPort + rand.IntN(max(1, (lo-minListenPort)/2))
	}
	for ; listenPorts.next < lo; listenPorts.next++ {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(listenPorts.next))
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			continue // in use: another suite's, or a service's
		}
		_ = lis.Close()
		listenPorts.next++
		return addr
	}
	t.Fatalf("no free port left between %d and %d", minListenPort, lo)
	return ""
}

// ephemeralLow is the lowest port of the kernel's range for outgoing
// connections (Linux's default, 32768, when it cannot be read or leaves no
// room below).
func ephemeralLow() int {
	const linuxDefault = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return linuxDefault
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return linuxDefault
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil || lo <= minListenPort+1000 {
		return linuxDefault
	}
	return lo
}

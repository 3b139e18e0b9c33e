package pgtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// patroniDirPrefix names the directories NewPatroni makes in os.TempDir(), so
// a later test process can find and reap the processes a killed one left.
const patroniDirPrefix = "idemgate-patroni-"

// patroniTimeout bounds a bootstrap, a failover or a switchover: Patroni's
// leader key lives 10s (deploy/patroni/patroni.yml), and a loaded machine
// starts PostgreSQL slowly.
const patroniTimeout = 3 * time.Minute

// Patroni is a three-node PostgreSQL cluster run by Patroni, with one etcd
// as its configuration store, all on loopback: the high-availability set-up
// docs/high-availability.md describes, with the settings of the file
// NewPatroni is given. Commits wait for a synchronous standby, and Patroni
// promotes only a synchronous node, so a crash of the leader loses no
// acknowledged commit.
type Patroni struct {
	tb       testing.TB
	dir      string
	bin      string
	config   string
	etcdPort int
	etcd     *exec.Cmd
	nodes    []*patroniNode
	cred     *syscall.Credential
}

type patroniNode struct {
	name            string
	pgPort, apiPort int
	cmd             *exec.Cmd
}

// NewPatroni starts etcd and three Patroni nodes (n0, n1, n2) with the shared
// settings in config and returns once one node leads and another is its
// synchronous standby. Everything is killed and removed when the test ends.
// Without patroni or etcd on PATH the test skips, except under CI=true, where
// it fails (.ci/run installs Debian's patroni and etcd-server). Run as root,
// the processes run as the postgres OS user.
func NewPatroni(tb testing.TB, config string) *Patroni {
	tb.Helper()
	for _, prog := range []string{"patroni", "patronictl", "etcd"} {
		if _, err := exec.LookPath(prog); err != nil {
			unavailable(tb, fmt.Sprintf("pgtest: Patroni needs %s on PATH (Debian: apt-get install patroni etcd-server): %v", prog, err))
		}
	}
	bin, err := postgresBinDir()
	if err != nil {
		unavailable(tb, fmt.Sprintf("pgtest: no PostgreSQL server binaries: %v", err))
	}
	config, err = filepath.Abs(config)
	if err != nil {
		tb.Fatal(err)
	}
	p := &Patroni{tb: tb, bin: bin, config: config}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			unavailable(tb, fmt.Sprintf("pgtest: running as root needs the postgres OS user: %v", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	reapPatroni(tb)
	p.dir, err = os.MkdirTemp("", patroniDirPrefix+"*")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.remove)
	if err := os.WriteFile(filepath.Join(p.dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		tb.Fatal(err)
	}
	if p.cred != nil {
		if err := os.Chown(p.dir, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			tb.Fatal(err)
		}
	}

	p.etcdPort = freePort(tb)
	peer := freePort(tb)
	client := fmt.Sprintf("http://127.0.0.1:%d", p.etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	p.etcd = p.start(tb, "etcd", nil, "etcd", "--name", "e0", "--data-dir", filepath.Join(p.dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL, "--initial-cluster", "e0="+peerURL)
	for i := range 3 {
		n := &patroniNode{name: "n" + strconv.Itoa(i), pgPort: freePort(tb), apiPort: freePort(tb)}
		p.nodes = append(p.nodes, n)
		p.startNode(tb, n)
	}
	p.WaitHealthy(tb, "")
	return p
}

// start runs prog in the cluster's directory as the postgres user (when
// root), in a process group of its own, logging to name.log.
func (p *Patroni) start(tb testing.TB, name string, env []string, prog string, args ...string) *exec.Cmd {
	tb.Helper()
	log, err := os.OpenFile(filepath.Join(p.dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(prog, args...)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: p.cred}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("pgtest: start %s: %v", name, err)
	}
	go func() { _ = cmd.Wait() }()
	if err := os.WriteFile(filepath.Join(p.dir, name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		tb.Fatal(err)
	}
	return cmd
}

// startNode starts a node's Patroni, which starts (or bootstraps, or clones)
// its PostgreSQL. What differs between nodes is set in the environment, as
// docs/high-availability.md shows.
func (p *Patroni) startNode(tb testing.TB, n *patroniNode) {
	tb.Helper()
	api := fmt.Sprintf("127.0.0.1:%d", n.apiPort)
	pg := fmt.Sprintf("127.0.0.1:%d", n.pgPort)
	n.cmd = p.start(tb, n.name, []string{
		"PATRONI_NAME=" + n.name,
		"PATRONI_RESTAPI_LISTEN=" + api, "PATRONI_RESTAPI_CONNECT_ADDRESS=" + api,
		"PATRONI_ETCD3_HOSTS=" + fmt.Sprintf("127.0.0.1:%d", p.etcdPort),
		"PATRONI_POSTGRESQL_LISTEN=" + pg, "PATRONI_POSTGRESQL_CONNECT_ADDRESS=" + pg,
		"PATRONI_POSTGRESQL_DATA_DIR=" + filepath.Join(p.dir, n.name),
		"PATRONI_POSTGRESQL_BIN_DIR=" + p.bin,
		// Patroni writes a password file for its own connections; nodes of
		// one OS user must not share it.
		"PATRONI_POSTGRESQL_PGPASS=" + filepath.Join(p.dir, n.name+".pgpass"),
	}, "patroni", p.config)
}

// URL returns the URL of database on the cluster: every node's address, with
// target_session_attrs=read-write, so a client keeps the node that accepts
// writes, whichever leads. User postgres, without TLS.
func (p *Patroni) URL(database string) string {
	hosts := make([]string, len(p.nodes))
	for i, n := range p.nodes {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", n.pgPort)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write", strings.Join(hosts, ","), database)
}

// WaitDatabase waits until every node has database: a replica that has not
// replayed its CREATE DATABASE yet (only the synchronous standby has it when
// the commit returns) refuses a connection to it with FATAL 3D000, and pgx
// tries no further host of a multi-host URL after such an answer.
func (p *Patroni) WaitDatabase(tb testing.TB, database string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patroniTimeout)
	defer cancel()
	for _, n := range p.nodes {
		for {
			_, err := queryString(ctx, p.NodeURL(n.name, database), "SELECT current_database()")
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				tb.Fatalf("pgtest: Patroni node %s has no database %s after %s: %v", n.name, database, patroniTimeout, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// NodeURL returns the URL of database on one node only.
func (p *Patroni) NodeURL(name, database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.node(name).pgPort, database)
}

func (p *Patroni) node(name string) *patroniNode {
	for _, n := range p.nodes {
		if n.name == name {
			return n
		}
	}
	p.tb.Fatalf("pgtest: no Patroni node %q", name)
	return nil
}

// member is one node as Patroni's /cluster endpoint reports it.
type member struct {
	Name  string `json:"name"`
	Role  string `json:"role"`
	State string `json:"state"`
}

// members asks any node that answers for the cluster's members.
func (p *Patroni) members() ([]member, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	var last error
	for _, n := range p.nodes {
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/cluster", n.apiPort))
		if err != nil {
			last = err
			continue
		}
		var c struct {
			Members []member `json:"members"`
		}
		err = json.NewDecoder(resp.Body).Decode(&c)
		_ = resp.Body.Close()
		if err != nil {
			last = err
			continue
		}
		return c.Members, nil
	}
	return nil, fmt.Errorf("no Patroni node answers: %w", last)
}

// WaitHealthy waits until a node other than not leads, running, with a
// running synchronous standby, and returns the leader's and the standby's
// names.
func (p *Patroni) WaitHealthy(tb testing.TB, not string) (leader, standby string) {
	tb.Helper()
	deadline := time.Now().Add(patroniTimeout)
	for {
		ms, err := p.members()
		leader, standby = "", ""
		for _, m := range ms {
			switch {
			case m.Role == "leader" && m.State == "running" && m.Name != not:
				leader = m.Name
			case m.Role == "sync_standby" && (m.State == "running" || m.State == "streaming"):
				standby = m.Name
			}
		}
		if leader != "" && standby != "" {
			return leader, standby
		}
		if time.Now().After(deadline) {
			tb.Fatalf("pgtest: Patroni has no running leader (other than %q) with a synchronous standby after %s: members %+v, %v\n%s",
				not, patroniTimeout, ms, err, p.logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// CrashLeader kills the leading node as a machine crash would: its Patroni
// and its PostgreSQL (the postmaster's whole process group: Patroni starts
// it in a session of its own) with SIGKILL. It returns the node's name; the
// leader key expires and Patroni promotes the synchronous standby.
func (p *Patroni) CrashLeader(tb testing.TB) string {
	tb.Helper()
	leader, _ := p.WaitHealthy(tb, "")
	n := p.node(leader)
	p.killNode(n)
	return leader
}

func (p *Patroni) killNode(n *patroniNode) {
	if pid, err := postmasterPID(filepath.Join(p.dir, n.name)); err == nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if n.cmd != nil && n.cmd.Process != nil {
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// postmasterPID reads the pid from a data directory's postmaster.pid.
func postmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// Restart starts a crashed node's Patroni again; it rejoins as a replica
// (pg_rewind, use_pg_rewind in the settings).
func (p *Patroni) Restart(tb testing.TB, name string) {
	tb.Helper()
	p.startNode(tb, p.node(name))
}

// Switchover hands the leadership over to the synchronous standby with
// patronictl switchover, as an operator does before maintenance, and returns
// the old and the new leader once the new one runs with a synchronous
// standby of its own.
func (p *Patroni) Switchover(tb testing.TB) (from, to string) {
	tb.Helper()
	from, to = p.WaitHealthy(tb, "")
	ctx, cancel := context.WithTimeout(context.Background(), patroniTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "patronictl", "-c", p.config, "switchover", "--leader", from, "--candidate", to, "--force")
	cmd.Env = append(os.Environ(), fmt.Sprintf("PATRONI_ETCD3_HOSTS=127.0.0.1:%d", p.etcdPort))
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("pgtest: patronictl switchover %s -> %s: %v\n%s", from, to, err, out)
	}
	if leader, _ := p.WaitHealthy(tb, from); leader != to {
		tb.Fatalf("pgtest: switchover to %s left %s leading", to, leader)
	}
	return from, to
}

// String names the nodes and their PostgreSQL ports, for test logs.
func (p *Patroni) String() string {
	var parts []string
	for _, n := range p.nodes {
		parts = append(parts, fmt.Sprintf("%s :%d", n.name, n.pgPort))
	}
	return "Patroni " + strings.Join(parts, ", ")
}

// logs returns the tails of the nodes' and etcd's logs, for a failure.
func (p *Patroni) logs() string {
	var b strings.Builder
	for _, name := range []string{"etcd", "n0", "n1", "n2"} {
		data, err := os.ReadFile(filepath.Join(p.dir, name+".log"))
		if err != nil {
			continue
		}
		if len(data) > 3000 {
			data = data[len(data)-3000:]
		}
		fmt.Fprintf(&b, "--- %s.log (tail)\n%s\n", name, data)
	}
	return b.String()
}

// remove kills every process of the cluster and deletes its directory; the
// logs go to the test log first when the test failed.
func (p *Patroni) remove() {
	if p.tb.Failed() {
		p.tb.Logf("pgtest: %s\n%s", p, p.logs())
	}
	for _, n := range p.nodes {
		p.killNode(n)
	}
	if p.etcd != nil && p.etcd.Process != nil {
		_ = syscall.Kill(-p.etcd.Process.Pid, syscall.SIGKILL)
	}
	killPatroniDir(p.dir)
	// A killed postmaster's backends notice its death within a moment;
	// removing the directory under them is harmless.
	if err := os.RemoveAll(p.dir); err != nil {
		p.tb.Errorf("pgtest: %v", err)
	}
}

// killPatroniDir kills the processes whose pids the cluster directory dir
// records: etcd's, the nodes' Patroni and their postmasters.
func killPatroniDir(dir string) {
	pids, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
	for _, f := range pids {
		if filepath.Base(f) == "owner.pid" {
			continue
		}
		if b, err := os.ReadFile(f); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
			}
		}
	}
	datas, _ := filepath.Glob(filepath.Join(dir, "n*", "postmaster.pid"))
	for _, f := range datas {
		if pid, err := postmasterPID(filepath.Dir(f)); err == nil && pid > 1 {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// reapPatroni kills and removes clusters whose test process is gone: one
// killed by a test timeout runs no cleanup.
func reapPatroni(tb testing.TB) {
	reapMu.Lock()
	defer reapMu.Unlock()
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), patroniDirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil || pid == os.Getpid() || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue
		}
		killPatroniDir(dir)
		if err := os.RemoveAll(dir); err == nil {
			tb.Logf("pgtest: removed the Patroni cluster %s left by test process %d", dir, pid)
		}
	}
}

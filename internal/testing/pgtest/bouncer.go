package pgtest

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Bouncer is a PgBouncer of one test in transaction pooling mode
// (pool_mode=transaction) in front of the shared server: every transaction
// may run on another server connection, so nothing a connection sets or
// prepares outside a transaction is there for its next one.
type Bouncer struct {
	port int
	dir  string
	cmd  *exec.Cmd
	log  *syncBuffer
}

// BouncerPoolSize is the server connections the Bouncer opens per role and
// database: fewer than the clients the tests run, so that clients share
// server connections as they do in production.
const BouncerPoolSize = 4

// NewBouncer starts pgbouncer (Debian's package) on a free loopback port,
// its configuration in a temporary directory, and stops it when the test
// ends. Any role of the shared server may log in without a password (it
// looks roles up as postgres, auth_query), to any database. Without
// pgbouncer on PATH or in /usr/sbin the test skips, except under CI=true,
// where it fails.
func NewBouncer(tb testing.TB) *Bouncer {
	tb.Helper()
	prog, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, statErr := os.Stat("/usr/sbin/pgbouncer"); statErr != nil {
			unavailable(tb, "pgtest: pgbouncer is not installed (apt-get install pgbouncer)")
		}
		prog = "/usr/sbin/pgbouncer"
	}
	server, err := pgconn.ParseConfig(URL())
	if err != nil {
		tb.Fatalf("pgtest: parse %s: %v", URL(), err)
	}
	dir, err := os.MkdirTemp("", "idemgate-pgbouncer-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	b := &Bouncer{port: freePort(tb), dir: dir, log: &syncBuffer{}}
	config := fmt.Sprintf(`[databases]
* = host=%s port=%d
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
auth_user = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
server_login_retry = 1
`, server.Host, server.Port, b.port, filepath.Join(dir, "users.txt"), server.User, BouncerPoolSize)
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(config), 0o644); err != nil {
		tb.Fatal(err)
	}
	// The one role listed; the others are looked up through it.
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(strconv.Quote(server.User)+` ""`+"\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	b.cmd = exec.Command(prog, filepath.Join(dir, "pgbouncer.ini"))
	if os.Geteuid() == 0 { // pgbouncer refuses to run as root
		if err := chownTree(dir, "postgres"); err != nil {
			tb.Fatalf("pgtest: %v", err)
		}
		cred, err := credentialOf("postgres")
		if err != nil {
			tb.Fatalf("pgtest: %v", err)
		}
		b.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	b.cmd.Dir = dir
	b.cmd.Stdout, b.cmd.Stderr = b.log, b.log
	if err := b.cmd.Start(); err != nil {
		tb.Fatalf("pgtest: start pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = b.cmd.Wait(); close(exited) }()
	tb.Cleanup(func() {
		_ = b.cmd.Process.Signal(syscall.SIGTERM) // immediate shutdown
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = b.cmd.Process.Kill()
			<-exited
		}
		if tb.Failed() {
			tb.Logf("pgtest: pgbouncer's log:\n%s", b.log.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", b.addr(), time.Second)
		if err == nil {
			_ = conn.Close()
			break
		}
		select {
		case <-exited:
			tb.Fatalf("pgtest: pgbouncer exited: %s", b.log.String())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("pgtest: pgbouncer does not listen on %s: %v\n%s", b.addr(), err, b.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return b
}

func (b *Bouncer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// URL returns the URL of database through the Bouncer as role, with the
// query parameters params (nil for none).
func (b *Bouncer) URL(role, database string, params url.Values) string {
	q := url.Values{"sslmode": {"disable"}}
	for k, v := range params {
		q[k] = v
	}
	u := url.URL{Scheme: "postgres", User: url.User(role), Host: b.addr(), Path: "/" + database, RawQuery: q.Encode()}
	return u.String()
}

// credentialOf returns the OS user name's ids, to run a program as it.
func credentialOf(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// syncBuffer is a bytes.Buffer safe for the process's writes and the
// test's reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

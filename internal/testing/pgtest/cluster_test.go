package pgtest_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

func connect(t *testing.T, c *pgtest.Cluster) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("connect to %s: %v", c.URL("postgres"), err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func exec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t *testing.T, conn *pgx.Conn, table string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

// A stopped cluster refuses connections; started again on the same port, it
// has the rows committed before, after a clean stop, an immediate one and a
// kill -9 (Kill) alike.
func TestClusterKeepsCommittedRowsAcrossStopAndStart(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"fast", "immediate", "kill"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			c := pgtest.NewCluster(t)
			if !c.Running() {
				t.Fatal("Running() = false after NewCluster")
			}
			before := connect(t, c)
			exec(t, before, "CREATE TABLE orders (id int PRIMARY KEY)")
			exec(t, before, "INSERT INTO orders VALUES (1), (2)")

			if mode == "kill" {
				c.Kill(t)
			} else {
				c.Stop(t, mode)
			}
			if c.Running() {
				t.Fatalf("Running() = true after Stop(%s)", mode)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if conn, err := pgx.Connect(ctx, c.URL("postgres")); err == nil {
				_ = conn.Close(ctx)
				t.Fatalf("connected to the stopped cluster")
			}
			if err := before.Ping(ctx); err == nil {
				t.Fatalf("a connection opened before Stop(%s) still answers", mode)
			}

			c.Start(t)
			if !c.Running() {
				t.Fatal("Running() = false after Start")
			}
			if n := count(t, connect(t, c), "orders"); n != 2 {
				t.Fatalf("orders has %d rows after Stop(%s) and Start, want 2", n, mode)
			}
		})
	}
}

// Two clusters of one test process are independent servers on their own
// ports.
func TestClustersAreIndependent(t *testing.T) {
	t.Parallel()
	a, b := pgtest.NewCluster(t), pgtest.NewCluster(t)
	if a.Port() == b.Port() || a.URL("postgres") == b.URL("postgres") {
		t.Fatalf("both clusters on port %d", a.Port())
	}
	exec(t, connect(t, a), "CREATE TABLE only_in_a (id int)")
	a.Stop(t, "immediate")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var exists bool
	if err := connect(t, b).QueryRow(ctx, "SELECT to_regclass('only_in_a') IS NOT NULL").Scan(&exists); err != nil || exists {
		t.Fatalf("cluster b sees a's table: %v, %v", exists, err)
	}
}

// BenchmarkNewCluster measures initdb and the first start. Each cluster is
// stopped at once but removed only when the benchmark ends: run it with a
// small -benchtime such as 10x.
func BenchmarkNewCluster(b *testing.B) {
	for b.Loop() {
		c := pgtest.NewCluster(b)
		b.StopTimer()
		c.Stop(b, "immediate")
		b.StartTimer()
	}
}

// BenchmarkCrashRestart measures a crash (Stop immediate) and the Start
// after it, which runs crash recovery.
func BenchmarkCrashRestart(b *testing.B) {
	c := pgtest.NewCluster(b)
	for b.Loop() {
		c.Stop(b, "immediate")
		c.Start(b)
	}
}

// A durable cluster syncs as a production server does (fsync and full page
// writes on, which NewCluster turns off), so a benchmark on it pays what a
// commit costs; its PostmasterPID is the server's process, whose children
// are the server's backends.
func TestDurableClusterSyncsAndNamesItsPostmaster(t *testing.T) {
	t.Parallel()
	c := pgtest.NewDurableClusterConf(t, "max_connections = 150\n")
	conn := connect(t, c)
	for setting, want := range map[string]string{"fsync": "on", "full_page_writes": "on", "max_connections": "150"} {
		var got string
		if err := conn.QueryRow(context.Background(), "SHOW "+setting).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("SHOW %s = %q, want %q", setting, got, want)
		}
	}
	pid, err := c.PostmasterPID()
	if err != nil {
		t.Fatal(err)
	}
	var backend int
	if err := conn.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", backend))
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	// The parent pid is the fourth field, after the command in parentheses.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if fields[1] != strconv.Itoa(pid) {
		t.Errorf("the backend's parent is %s, PostmasterPID() = %d", fields[1], pid)
	}
}

// RefuseTCP cuts the server off from its TCP clients without restarting
// it: an open connection is ended and a new one refused, and after
// AcceptTCP a new one gets through to the same server (same start time).
func TestClusterRefusesAndAcceptsTCP(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t)
	startOf := func(conn *pgx.Conn) time.Time {
		t.Helper()
		var start time.Time
		if err := conn.QueryRow(context.Background(), "SELECT pg_postmaster_start_time()").Scan(&start); err != nil {
			t.Fatal(err)
		}
		return start
	}
	open := connect(t, c)
	before := startOf(open)
	c.RefuseTCP(t)
	if _, err := open.Exec(context.Background(), "SELECT 1"); err == nil {
		t.Error("a connection opened before RefuseTCP still works")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, c.URL("postgres")); err == nil {
		conn.Close(ctx)
		t.Fatal("a TCP connection got through after RefuseTCP")
	}
	c.AcceptTCP(t)
	if after := startOf(connect(t, c)); !after.Equal(before) {
		t.Errorf("the server started at %v, then %v: RefuseTCP restarted it", before, after)
	}
}

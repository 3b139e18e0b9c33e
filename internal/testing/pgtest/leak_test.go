package pgtest

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// recorder is a testing.TB that keeps what was logged and reported, so a
// test can see what pgtest told another test.
type recorder struct {
	testing.TB
	logs, errors []string
}

func (r *recorder) Helper()                      {}
func (r *recorder) Logf(format string, a ...any) { r.logs = append(r.logs, fmt.Sprintf(format, a...)) }
func (r *recorder) Errorf(format string, a ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, a...))
}

func adminConn(t *testing.T) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		unreachable(t, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// The names carry the creating process's pid, which ownerPID reads back;
// names of another form (an older pgtest's, another tool's) have no owner.
func TestSchemaNamesCarryTheirProcess(t *testing.T) {
	name := schemaName(schemaPrefix)
	if !strings.HasPrefix(name, schemaPrefix) {
		t.Fatalf("schemaName(schemaPrefix) = %q, want prefix %q", name, schemaPrefix)
	}
	if pid, ok := ownerPID(schemaPrefix, name); !ok || pid != os.Getpid() {
		t.Errorf("ownerPID(%q) = %d, %v; want %d, true", name, pid, ok, os.Getpid())
	}
	otherNamespace := schemaPrefix + strconv.Itoa(os.Getpid()) + "n1_abc" // a process in another pid namespace
	for _, other := range []string{"idemgate_test_ab12cd34ef56", "public", schemaPrefix + "x_abc", schemaPrefix + "12", otherNamespace} {
		if pid, ok := ownerPID(schemaPrefix, other); ok {
			t.Errorf("ownerPID(%q) = %d, true; want no owner", other, pid)
		}
	}
}

// existingSchemas reports a schema until it is dropped.
func TestExistingSchemas(t *testing.T) {
	t.Parallel()
	conn := adminConn(t)
	ctx := context.Background()
	name := schemaName(schemaPrefix)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+name+" CASCADE") })
	got, err := existingSchemas(ctx, conn, []string{name, schemaName(schemaPrefix)})
	if err != nil || len(got) != 1 || got[0] != name {
		t.Fatalf("existingSchemas = %v, %v; want [%s]", got, err, name)
	}
	if _, err := conn.Exec(ctx, "DROP SCHEMA "+name); err != nil {
		t.Fatal(err)
	}
	if got, err := existingSchemas(ctx, conn, []string{name}); err != nil || len(got) != 0 {
		t.Fatalf("after the drop existingSchemas = %v, %v; want none", got, err)
	}
}

// A schema whose drop did not take (here: none was attempted) fails the test
// that made it, naming it.
func TestCheckDroppedFailsTheTestOnALeftover(t *testing.T) {
	t.Parallel()
	conn := adminConn(t)
	name := schemaName(schemaPrefix)
	if _, err := conn.Exec(context.Background(), "CREATE SCHEMA "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+name+" CASCADE") })
	r := &recorder{TB: t}
	checkDropped(r, name)
	if len(r.errors) != 1 || !strings.Contains(r.errors[0], name) || !strings.Contains(r.errors[0], "still exists") {
		t.Fatalf("checkDropped reported %q; want one error naming %s", r.errors, name)
	}
	if _, err := conn.Exec(context.Background(), "DROP SCHEMA "+name); err != nil {
		t.Fatal(err)
	}
	r = &recorder{TB: t}
	checkDropped(r, name)
	if len(r.errors) != 0 {
		t.Fatalf("checkDropped on a dropped schema reported %q", r.errors)
	}
}

// A test process killed before its cleanups ran leaves its schema behind; the
// next pgtest user finds it by its dead owner, drops it and says so, and
// leaves alone the schemas of live processes (parallel test packages).
func TestReapSchemasOfKilledProcesses(t *testing.T) {
	// The child leaks under a prefix of this test's own: a parallel test
	// process reaping it first would fail, under CI=true, for this leak.
	const leakPrefix = "idemgate_test_leak_p"
	if os.Getenv("PGTEST_LEAK_CHILD") == "1" {
		ownPrefix = leakPrefix
		_, schema := EmptySchema(t)
		os.Stdout.WriteString("schema=" + schema + "\n")
		// Killed as a timeout or a ^C would: no cleanup runs.
		p, _ := os.FindProcess(os.Getpid())
		_ = p.Kill()
		time.Sleep(time.Minute)
		return
	}
	t.Parallel()
	conn := adminConn(t)
	ctx := context.Background()
	live := schemaName(leakPrefix) // ours: this process is alive
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+live); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+live+" CASCADE") })

	cmd := exec.Command(os.Args[0], "-test.run=^TestReapSchemasOfKilledProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGTEST_LEAK_CHILD=1")
	out, _ := cmd.Output()
	_, after, ok := strings.Cut(string(out), "schema=")
	if !ok {
		t.Fatalf("the child printed no schema: %s", out)
	}
	leaked := strings.Fields(after)[0]
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+leaked+" CASCADE") })
	if pid, ok := ownerPID(leakPrefix, leaked); !ok || pid != cmd.Process.Pid {
		t.Fatalf("leaked schema %s: owner %d, %v; want the child %d", leaked, pid, ok, cmd.Process.Pid)
	}
	if got, err := existingSchemas(ctx, conn, []string{leaked}); err != nil || len(got) != 1 {
		t.Fatalf("the killed child's schema %s is not there to reap: %v, %v", leaked, got, err)
	}

	r := &recorder{TB: t}
	reapSchemas(r, conn, leakPrefix)
	if got, err := existingSchemas(ctx, conn, []string{leaked, live}); err != nil || len(got) != 1 || got[0] != live {
		t.Fatalf("after reapSchemas the schemas left are %v (%v); want only the live process's %s", got, err, live)
	}
	all := strings.Join(append(r.logs, r.errors...), "\n")
	if !strings.Contains(all, leaked) || !strings.Contains(all, strconv.Itoa(cmd.Process.Pid)) {
		t.Errorf("reapSchemas said %q; want the schema %s and its process %d named", all, leaked, cmd.Process.Pid)
	}
	if os.Getenv("CI") == "true" && len(r.errors) == 0 {
		t.Error("under CI=true a leftover schema must fail the test that finds it")
	}
}

// DropDatabase drops the database when the test ends, on a connection of its
// own (one the test closed cannot drop it), and checks that it is gone.
func TestDropDatabase(t *testing.T) {
	t.Parallel()
	conn := adminConn(t)
	ctx := context.Background()
	name := "pgtest-Drop_" + strings.ToLower(rand.Text()[:8]) // quoting needed
	t.Run("owner", func(t *testing.T) {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		DropDatabase(t, name)
	})
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after its test ended database %s is there %d times (%v); want dropped", name, n, err)
	}
}

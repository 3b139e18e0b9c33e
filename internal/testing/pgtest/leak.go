package pgtest

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// schemaPrefix starts the name of every schema EmptySchema makes on the
// shared server; the name goes on with the creating process's pid and pid
// namespace, so a later process can tell a schema a killed test process left
// from one a parallel test package is using: idemgate_test_p<pid>n<ns>_<random>.
const schemaPrefix = "idemgate_test_p"

// ownPrefix is the prefix EmptySchema names its schemas with: schemaPrefix,
// except in the child process of pgtest's own leak test, which leaks under
// another prefix so that no parallel test process reaps it first.
var ownPrefix = schemaPrefix

// pidNamespace is this process's pid namespace (the inode of
// /proc/self/ns/pid), 0 where there is none to read: a pid means a process
// only within its namespace.
var pidNamespace = sync.OnceValue(func() uint64 {
	link, err := os.Readlink("/proc/self/ns/pid") // pid:[4026531836]
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "pid:["), "]"), 10, 64)
	return n
})

// schemaName returns a fresh schema name under prefix owned by this process.
func schemaName(prefix string) string {
	return prefix + strconv.Itoa(os.Getpid()) + "n" + strconv.FormatUint(pidNamespace(), 10) + "_" + strings.ToLower(rand.Text()[:10])
}

// ownerPID returns the pid of the process that made schema, if schemaName
// made it under prefix in this process's pid namespace (so that the pid can
// be judged here).
func ownerPID(prefix, schema string) (int, bool) {
	rest, ok := strings.CutPrefix(schema, prefix)
	if !ok {
		return 0, false
	}
	owner, random, ok := strings.Cut(rest, "_")
	if !ok || random == "" {
		return 0, false
	}
	pidText, nsText, ok := strings.Cut(owner, "n")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(pidText)
	if err != nil || pid <= 0 {
		return 0, false
	}
	if ns, err := strconv.ParseUint(nsText, 10, 64); err != nil || ns != pidNamespace() {
		return 0, false
	}
	return pid, true
}

// existingSchemas returns those of names that exist on conn's database.
func existingSchemas(ctx context.Context, conn *pgx.Conn, names []string) ([]string, error) {
	rows, err := conn.Query(ctx, "SELECT nspname FROM pg_namespace WHERE nspname = ANY($1) ORDER BY nspname", names)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// checkDropped fails tb if schema still exists: run after the test's
// cleanups dropped it, so that a leak (a drop that did not take, whatever
// swallowed its error) fails the test that made the schema instead of
// piling up in the shared server.
func checkDropped(tb testing.TB, schema string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		tb.Errorf("pgtest: checking that schema %s was dropped: %v", schema, err)
		return
	}
	defer conn.Close(ctx)
	left, err := existingSchemas(ctx, conn, []string{schema})
	switch {
	case err != nil:
		tb.Errorf("pgtest: checking that schema %s was dropped: %v", schema, err)
	case len(left) > 0:
		tb.Errorf("pgtest: schema %s still exists after the test's cleanups: it leaks into the shared server", schema)
	}
}

// reapOnce runs reapSchemas at the first EmptySchema of a process.
var reapOnce sync.Once

// reapSchemas drops the schemas under prefix whose owning test process has exited without
// dropping them (killed by a timeout, a signal or ^C before its cleanups
// ran), and says which: logged, and under CI=true, where nothing should
// ever be killed, an error of tb's. Schemas of live processes, parallel test
// packages among them, and names of another form are left alone.
func reapSchemas(tb testing.TB, conn *pgx.Conn, prefix string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)", prefix)
	if err != nil {
		tb.Logf("pgtest: listing leftover schemas: %v", err)
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Logf("pgtest: listing leftover schemas: %v", err)
		return
	}
	defer reapRoles(ctx, tb, conn, prefix)
	for _, name := range names {
		pid, ok := ownerPID(prefix, name)
		if !ok || pid == os.Getpid() || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue // not judged here, ours, or its process is alive
		}
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE"); err != nil {
			tb.Logf("pgtest: dropping schema %s left by exited test process %d: %v", name, pid, err)
			continue
		}
		msg := "pgtest: dropped schema " + name + ", left by test process " + strconv.Itoa(pid) +
			", which exited before its cleanups ran (killed by a timeout or a signal?)"
		if os.Getenv("CI") == "true" {
			tb.Errorf("%s", msg)
		} else {
			tb.Logf("%s", msg)
		}
	}
}

// reapRoles drops the roles NewRoles made (named after their schema) whose
// test process exited without dropping them; roles are cluster-wide, so
// they would outlive every database.
func reapRoles(ctx context.Context, tb testing.TB, conn *pgx.Conn, prefix string) {
	rows, err := conn.Query(ctx, "SELECT rolname FROM pg_roles WHERE starts_with(rolname, $1)", prefix)
	if err != nil {
		tb.Logf("pgtest: listing leftover roles: %v", err)
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Logf("pgtest: listing leftover roles: %v", err)
		return
	}
	for _, name := range names {
		pid, ok := ownerPID(prefix, name)
		if !ok || pid == os.Getpid() || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue
		}
		role := pgx.Identifier{name}.Sanitize()
		_, _ = conn.Exec(ctx, "DROP OWNED BY "+role)
		if _, err := conn.Exec(ctx, "DROP ROLE IF EXISTS "+role); err != nil {
			tb.Logf("pgtest: dropping role %s left by exited test process %d: %v", name, pid, err)
			continue
		}
		tb.Logf("pgtest: dropped role %s, left by test process %d, which exited before its cleanups ran", name, pid)
	}
}

// DropDatabase drops database name on the shared server when tb ends (WITH
// FORCE, so a connection left open does not stop it), on a connection of its
// own, and fails tb if it is still there: for the tests that create a
// database of their own there, which Schema cannot give them.
func DropDatabase(tb testing.TB, name string) {
	tb.Helper()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, URL())
		if err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
			return
		}
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil || n != 0 {
			tb.Errorf("pgtest: database %s still exists after the test's cleanups (%v): it leaks into the shared server", name, err)
		}
	})
}

package pgtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyName is the standby's application_name, which the primary's
// synchronous_standby_names names.
const StandbyName = "pgtest_standby"

// Replicated is a primary and a streaming-replication standby on loopback, the
// standby synchronous: the primary acknowledges a commit only once the standby
// has flushed its WAL, so a commit acknowledged before the primary dies is on
// the standby, and survives its promotion.
type Replicated struct {
	primary, standby *Cluster
}

// NewReplicatedCluster starts a primary (NewCluster's settings plus
// wal_level=replica and synchronous_standby_names naming the standby), makes
// the standby from it with pg_basebackup -R, starts it on its own loopback
// port and returns once the primary reports the standby as its synchronous
// standby. Both nodes are stopped (immediate) and removed when the test ends.
// Replication connections are trusted from 127.0.0.1, as initdb -A trust
// writes pg_hba.conf; the standby replicates as user postgres.
func NewReplicatedCluster(tb testing.TB) *Replicated {
	tb.Helper()
	r := &Replicated{primary: newCluster(tb)}
	r.primary.initdb(tb)
	// Commits wait for the standby from the start: nothing written before the
	// standby caught up can be lost by a failover. synchronous_commit is on by
	// default; said here because the guarantee rests on it.
	appendConf(tb, r.primary, fmt.Sprintf("wal_level = replica\nmax_wal_senders = 4\nsynchronous_commit = on\nsynchronous_standby_names = '%s'\n", StandbyName))
	r.primary.startOnFreePort(tb)

	r.standby = newCluster(tb)
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", r.primary.port, StandbyName)
	// -R writes standby.signal and a primary_conninfo with this conninfo's
	// application_name; -X stream copies the WAL written meanwhile; -c fast
	// does not wait for a scheduled checkpoint.
	if out, err := r.standby.run(filepath.Join(r.standby.bin, "pg_basebackup"), "-d", conninfo, "-D", r.standby.dataDir(), "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		tb.Fatalf("pgtest: pg_basebackup from port %d: %v\n%s", r.primary.port, err, out)
	}
	// The copied postgresql.conf names the standby itself as its synchronous
	// standby; once promoted, it would wait for itself on every commit.
	appendConf(tb, r.standby, "synchronous_standby_names = ''\n")
	r.standby.startOnFreePort(tb)
	r.waitSynchronous(tb)
	return r
}

// appendConf appends lines to the cluster's postgresql.conf: later settings
// win.
func appendConf(tb testing.TB, c *Cluster, lines string) {
	tb.Helper()
	f, err := os.OpenFile(filepath.Join(c.dataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if _, err := f.WriteString("\n# pgtest\n" + lines); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if err := f.Close(); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
}

// waitSynchronous waits until the primary streams to the standby as its
// synchronous standby.
func (r *Replicated) waitSynchronous(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	var last string
	for {
		state, err := queryString(ctx, r.primary.URL("postgres"),
			"SELECT coalesce((SELECT state || '/' || sync_state FROM pg_stat_replication WHERE application_name = $1), 'absent')", StandbyName)
		if err == nil && state == "streaming/sync" {
			return
		}
		last = fmt.Sprintf("%s %v", state, err)
		select {
		case <-ctx.Done():
			tb.Fatalf("pgtest: standby on port %d is not the synchronous standby after %s: replication state %s\n%s",
				r.standby.port, clusterTimeout, last, r.standby.serverLog())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// queryString runs a one-value query on a fresh connection to url.
func queryString(ctx context.Context, url, sql string, args ...any) (string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var s string
	err = conn.QueryRow(ctx, sql, args...).Scan(&s)
	return s, err
}

// Primary returns the primary node. After KillPrimary it stays down: started
// again, it would come back as a second primary.
func (r *Replicated) Primary() *Cluster { return r.primary }

// Standby returns the standby node: read-only until Promote, then the
// primary.
func (r *Replicated) Standby() *Cluster { return r.standby }

// URL returns a multi-host URL of database that names the primary, then the
// standby, with target_session_attrs=read-write: a client (libpq, or pgx's
// pgconn) tries the hosts in order and keeps the first that accepts writes,
// so after a failover new connections reach the promoted standby. User
// postgres, without TLS.
func (r *Replicated) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		r.primary.port, r.standby.port, database)
}

// KillPrimary stops the primary with pg_ctl stop -m immediate, as a crash
// would, and returns once it has exited. Every commit it acknowledged is on
// the standby.
func (r *Replicated) KillPrimary(tb testing.TB) {
	tb.Helper()
	r.primary.Stop(tb, "immediate")
}

// Promote promotes the standby (pg_ctl promote) and returns once it accepts
// writes.
func (r *Replicated) Promote(tb testing.TB) {
	tb.Helper()
	if out, err := r.standby.pgCtl("promote"); err != nil {
		tb.Fatalf("pgtest: pg_ctl promote on port %d: %v\n%s\n%s", r.standby.port, err, out, r.standby.serverLog())
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	for {
		// pg_ctl promote -w waits for the end of recovery; a session may
		// still start read-only a moment longer.
		ro, err := queryString(ctx, r.standby.URL("postgres"), "SHOW transaction_read_only")
		if err == nil && ro == "off" {
			return
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("pgtest: promoted standby on port %d does not accept writes after %s: transaction_read_only=%s, %v\n%s",
				r.standby.port, clusterTimeout, ro, err, r.standby.serverLog())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// String names the nodes' ports, for test logs.
func (r *Replicated) String() string {
	return "primary :" + strconv.Itoa(r.primary.port) + ", standby :" + strconv.Itoa(r.standby.port)
}

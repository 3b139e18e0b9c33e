package pgtest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// patroniConfig is the configuration docs/high-availability.md documents.
const patroniConfig = "../../../deploy/patroni/patroni.yml"

// Every commit acknowledged through the multi-host URL survives a crash of
// the leader (Patroni promotes the synchronous standby) and a switchover,
// and the same URL reaches the new leader each time.
func TestPatroniLosesNoAcknowledgedCommit(t *testing.T) {
	t.Parallel()
	p := pgtest.NewPatroni(t, patroniConfig)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url := p.URL("postgres")
	exec := func(sql string) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			conn, err := pgx.Connect(ctx, url)
			if err == nil {
				_, err = conn.Exec(ctx, sql)
				_ = conn.Close(ctx)
			}
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v", sql, err)
			}
		}
	}
	count := func() int {
		t.Helper()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM acknowledged").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	exec("CREATE TABLE acknowledged (id int PRIMARY KEY)")
	for i := range 20 {
		exec(fmt.Sprintf("INSERT INTO acknowledged VALUES (%d)", i))
	}
	crashed := p.CrashLeader(t)
	leader, _ := p.WaitHealthy(t, crashed)
	t.Logf("%s crashed, %s leads", crashed, leader)
	if n := count(); n != 20 {
		t.Fatalf("after the failover %d rows, want 20", n)
	}
	exec("INSERT INTO acknowledged VALUES (20)")
	p.Restart(t, crashed)
	from, to := p.Switchover(t)
	t.Logf("switched over from %s to %s", from, to)
	exec("INSERT INTO acknowledged VALUES (21)")
	if n := count(); n != 22 {
		t.Fatalf("after the switchover %d rows, want 22", n)
	}
}

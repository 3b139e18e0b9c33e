package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

func connectURL(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// The multi-host URL reaches the primary; rows committed there are on the
// synchronous standby the moment the commit returns, so after the primary
// is killed and the standby promoted, the same URL reaches the standby, with
// every row, and writes go on.
func TestReplicatedClusterFailsOverWithoutLosingCommits(t *testing.T) {
	t.Parallel()
	start := time.Now()
	r := pgtest.NewReplicatedCluster(t)
	t.Logf("replicated cluster (%s) ready in %s", r, time.Since(start).Round(time.Millisecond))

	standby := connectURL(t, r.Standby().URL("postgres"))
	var ro string
	if err := standby.QueryRow(context.Background(), "SHOW transaction_read_only").Scan(&ro); err != nil || ro != "on" {
		t.Fatalf("standby transaction_read_only = %q, %v; want on before Promote", ro, err)
	}

	before := connectURL(t, r.URL("postgres"))
	exec(t, before, "CREATE TABLE orders (id int PRIMARY KEY)")
	exec(t, before, "INSERT INTO orders VALUES (1), (2)")

	r.KillPrimary(t)
	if r.Primary().Running() {
		t.Fatal("primary Running() after KillPrimary")
	}
	// No immediate read of the standby here: it has the rows already (the
	// commit waited for it), and Promote must not depend on a client.
	r.Promote(t)

	after := connectURL(t, r.URL("postgres"))
	if n := count(t, after, "orders"); n != 2 {
		t.Fatalf("after failover orders has %d rows; want 2", n)
	}
	exec(t, after, "INSERT INTO orders VALUES (3)")
	if n := count(t, after, "orders"); n != 3 {
		t.Fatalf("after an insert on the promoted standby orders has %d rows; want 3", n)
	}
}

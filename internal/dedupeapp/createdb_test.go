package dedupeapp_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// CreateDatabase creates the database its URL names, whatever the name
// (one that needs quoting too), once: a second call finds it.
func TestCreateDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := fmt.Sprintf("idemgate-Test_%d", time.Now().UnixNano()) // a dash and capitals: quoted
	u, err := url.Parse(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	q := u.Query()
	q.Set("application_name", "createdb_test") // a query the URL keeps
	u.RawQuery = q.Encode()
	admin, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Skipf("no PostgreSQL at %s: %v", pgtest.URL(), err)
	}
	defer admin.Close(ctx)
	// Not on admin, which is closed by then: that left every run's database behind.
	pgtest.DropDatabase(t, name)

	for i, want := range []bool{true, false} {
		created, err := dedupeapp.CreateDatabase(ctx, u.String())
		if err != nil || created != want {
			t.Fatalf("call %d: created %v, %v; want %v, nil", i+1, created, err, want)
		}
	}
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("the created database does not open: %v", err)
	}
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != name {
		t.Errorf("current_database() = %q, %v; want %q", db, err, name)
	}
	conn.Close(ctx)

	for _, bad := range []string{"postgres://127.0.0.1:5432/?sslmode=disable", "not a url ::"} {
		if _, err := dedupeapp.CreateDatabase(ctx, bad); err == nil || !strings.Contains(err.Error(), "-database-url") {
			t.Errorf("CreateDatabase(%q) = %v, want an error naming -database-url", bad, err)
		}
	}
}

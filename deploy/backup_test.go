package deploy_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// freshDatabase creates an empty database on the test server, dropped when
// the test ends, and returns its URL.
func freshDatabase(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL: %v", err)
		}
		t.Skipf("PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idemgate_backup_" + hex.EncodeToString(b)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, pgtest.URL())
		if err != nil {
			t.Errorf("drop %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	u, err := url.Parse(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// docBlock returns the ```sh block after marker in docs/operating.md.
func docBlock(t *testing.T, marker string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- " + regexp.QuoteMeta(marker) + " -->\\s*```sh\\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatalf("docs/operating.md has no ```sh block after <!-- %s -->", marker)
	}
	return string(m[1])
}

// dedupe starts the real dedupesvc binary on databaseURL and returns a
// client.
func dedupe(t *testing.T, bin, databaseURL string) idemgatev1.DedupeServiceClient {
	t.Helper()
	addr := stacktest.FreeAddr(t)
	p := proctest.Start(t, bin, []string{"-listen", addr, "-metrics-listen", stacktest.FreeAddr(t)}, []string{"DATABASE_URL=" + databaseURL})
	p.WaitTCP(t, addr, 2*time.Minute)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return idemgatev1.NewDedupeServiceClient(conn)
}

// The documented backup and restore, run as written: an outcome stored
// before the backup is replayed, byte for byte, by a service on the
// restored database, and migrate status there lists every migration
// applied.
func TestBackupAndRestoreAsDocumented(t *testing.T) {
	for _, tool := range []string{"pg_dump", "pg_restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: install PostgreSQL's client programs (apt-get install postgresql-client)", tool)
		}
	}
	bin := proctest.Build(t, "github.com/idemgate/idemgate/cmd/dedupesvc")
	source, target := freshDatabase(t), freshDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	outcome, err := anypb.New(wrapperspb.String("charge ch_000042"))
	if err != nil {
		t.Fatal(err)
	}
	begin := &idemgatev1.BeginRequest{Scope: "/backup.Test/Charge", Key: "order-1", Fingerprint: make([]byte, 32), AttemptToken: "attempt-1",
		Lease: durationpb.New(30 * time.Second), Retention: durationpb.New(time.Hour)}
	before := dedupe(t, bin, source)
	res, err := before.Begin(ctx, begin)
	if err != nil || res.GetReserved() == nil {
		t.Fatalf("Begin = %v, %v; want the reservation", res, err)
	}
	if _, err := before.Finish(ctx, &idemgatev1.FinishRequest{Scope: begin.Scope, Key: begin.Key, AttemptToken: begin.AttemptToken,
		Epoch: res.GetReserved().GetEpoch(), Outcome: outcome}); err != nil {
		t.Fatalf("Finish: %v", err)
	}

	// The documented commands, with this test's databases and the built
	// dedupesvc first on PATH.
	dir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(dir, "dedupesvc")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", docBlock(t, "backup-restore"))
	cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"),
		"DATABASE_URL="+source, "RESTORE_URL="+target, "BACKUP="+filepath.Join(dir, "idemgate.dump"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the documented backup and restore: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("applied")) || bytes.Contains(out, []byte("pending")) {
		t.Errorf("migrate status on the restored database:\n%s\nwant every migration applied", out)
	}

	after := dedupe(t, bin, target)
	begin.AttemptToken = "attempt-2"
	res, err = after.Begin(ctx, begin)
	if err != nil {
		t.Fatal(err)
	}
	got := res.GetCompleted().GetOutcome()
	if got == nil || !proto.Equal(got, outcome) || !bytes.Equal(got.GetValue(), outcome.GetValue()) {
		t.Fatalf("Begin on the restored database = %v, want the stored outcome %v", res, outcome)
	}
	if strings.Contains(string(out), "ERROR") {
		t.Errorf("the restore printed an error:\n%s", out)
	}
}

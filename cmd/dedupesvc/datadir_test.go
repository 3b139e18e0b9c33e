//go:build faults

// Real dedupesvc processes on one data directory: in `make faults` with the
// other real-process tests.

package main_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// A second dedupesvc on the embedded store another one serves is refused,
// naming the process that holds it and what to do; the first keeps serving.
func TestSecondProcessOnOneEmbeddedStoreIsRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	bin := proctest.Build(t, dedupesvcPkg)
	addr := stacktest.FreeAddr(t)
	first := proctest.Start(t, bin, []string{"-listen", addr, "-data-dir", dir, "-metrics-listen", ""}, []string{"DATABASE_URL="})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Generous: the binary starts inside this deadline on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	health := healthpb.NewHealthClient(conn)
	if h, err := health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first process: health = %v, %v", h, err)
	}

	for _, args := range [][]string{
		{"-listen", stacktest.FreeAddr(t), "-data-dir", dir, "-metrics-listen", ""},
		{"-data-dir", dir, "migrate"},
	} {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL=")
		out, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 1 {
			t.Fatalf("second dedupesvc %q exited %d (%v), want 1:\n%s", args, code, err, out)
		}
		for _, want := range []string{"-data-dir " + dir, fmt.Sprintf("pid %d on host ", first.Pid()), "stop that process"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("second dedupesvc %q said:\n%s\nwant it to say %q", args, out, want)
			}
		}
	}
	if h, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("first process after the refusals: health = %v, %v", h, err)
	}
}

// A data directory the service's user may not write into is reported with
// its path and the fix, not as SQLite's bare "unable to open database file
// (14)". Root writes anywhere, so as root the binary runs as nobody.
func TestReadOnlyDataDirectory(t *testing.T) {
	bin := proctest.Build(t, dedupesvcPkg)
	parent, err := os.MkdirTemp("", "dedupesvc-readonly-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(parent, "data"), 0o700); os.RemoveAll(parent) })
	dir := filepath.Join(parent, "data")
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		// nobody needs to reach the binary and the directory.
		const nobody = 65534
		cred = &syscall.Credential{Uid: nobody, Gid: nobody}
		copied := filepath.Join(parent, "dedupesvc")
		content, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(copied, content, 0o755); err != nil {
			t.Fatal(err)
		}
		bin = copied
		if err := os.Chmod(parent, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	dedupesvc := func(args ...string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL=")
		cmd.Dir = parent
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, _ := cmd.CombinedOutput()
		return cmd.ProcessState.ExitCode(), string(out)
	}
	if code, out := dedupesvc("-data-dir", dir, "migrate"); code != 0 {
		t.Fatalf("migrate into a writable directory exited %d:\n%s", code, out)
	}
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	code, out := dedupesvc("-data-dir", dir, "-listen", stacktest.FreeAddr(t), "-metrics-listen", "")
	if code != 1 {
		t.Fatalf("serving from a read-only directory exited %d, want 1:\n%s", code, out)
	}
	for _, want := range []string{"-data-dir " + dir, filepath.Join(dir, "dedupe.db"), "must be able to write", "chown"} {
		if !strings.Contains(out, want) {
			t.Errorf("dedupesvc said:\n%s\nwant it to say %q", out, want)
		}
	}
}

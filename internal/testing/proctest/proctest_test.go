package proctest_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/gobuild"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

const echoPkg = "github.com/idemgate/idemgate/internal/testing/proctest/testdata/echo"

func startEcho(t *testing.T) (*proctest.Process, net.Conn) {
	t.Helper()
	addr := stacktest.FreeAddr(t)
	p := proctest.Start(t, proctest.Build(t, echoPkg), []string{addr}, []string{"PROCTEST_GREETING=hi"})
	p.WaitTCP(t, addr, time.Minute)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return p, conn
}

// echo sends line and reads the reply, giving up after wait.
func echo(conn net.Conn, r *bufio.Reader, line string, wait time.Duration) (string, error) {
	if _, err := fmt.Fprintln(conn, line); err != nil {
		return "", err
	}
	if err := conn.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return "", err
	}
	reply, err := r.ReadString('\n')
	return strings.TrimSpace(reply), err
}

func TestBuildBuildsOncePerPackage(t *testing.T) {
	t.Parallel()
	a, b := proctest.Build(t, echoPkg), proctest.Build(t, echoPkg)
	if a != b {
		t.Fatalf("Build gave %s, then %s", a, b)
	}
	if _, err := os.Stat(a); err != nil {
		t.Fatal(err)
	}
}

// Build uses the flags every builder shares (internal/gobuild), so that a
// cold make test compiles each dependency once for the non-race binaries.
func TestBuildUsesTheSharedFlags(t *testing.T) {
	t.Parallel()
	if err := gobuild.Check(proctest.Build(t, echoPkg)); err != nil {
		t.Fatal(err)
	}
}

// A paused process answers nothing until resumed, and SIGTERM lets it exit
// cleanly; its environment and output are the test's to see.
func TestPauseResumeAndSignal(t *testing.T) {
	t.Parallel()
	p, conn := startEcho(t)
	r := bufio.NewReader(conn)
	if reply, err := echo(conn, r, "one", time.Minute); err != nil || reply != "one" {
		t.Fatalf("echo = %q, %v", reply, err)
	}

	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	// Paused, it cannot answer however long we wait: no timing assumption.
	if reply, err := echo(conn, r, "two", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("paused process answered %q, %v", reply, err)
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if reply, err := r.ReadString('\n'); err != nil || strings.TrimSpace(reply) != "two" {
		t.Fatalf("after Resume: %q, %v; want the held reply", reply, err)
	}

	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(time.Minute); err != nil {
		t.Fatalf("exit after SIGTERM: %v, want status 0", err)
	}
	if log := p.Log(); !strings.Contains(log, "greeting=hi") || !strings.Contains(log, "bye") {
		t.Fatalf("log %q lacks the greeting from env or the goodbye", log)
	}
	if err := p.Signal(syscall.SIGTERM); err == nil {
		t.Fatal("Signal to an exited process succeeded")
	}
}

// Kill ends even a paused process at once, and Wait reports the signal.
func TestKill(t *testing.T) {
	t.Parallel()
	p, _ := startEcho(t)
	if err := p.Wait(10 * time.Millisecond); !errors.Is(err, proctest.ErrStillRunning) {
		t.Fatalf("Wait on a running process = %v, want ErrStillRunning", err)
	}
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	p.Kill()
	var exit *exec.ExitError
	err := p.Wait(0)
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("Wait after Kill = %v, want killed by SIGKILL", err)
	}
	p.Kill() // a second Kill is harmless
}

// WaitTCP on a process that exits before it listens fails at once with the
// process's log. An echo with no address argument exits at start.
func TestWaitTCPFailsWhenTheProcessExits(t *testing.T) {
	t.Parallel()
	p := proctest.Start(t, proctest.Build(t, echoPkg), []string{"127.0.0.1:no-port"}, nil)
	ft := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() { // Fatalf ends its goroutine
		defer close(done)
		p.WaitTCP(ft, stacktest.FreeAddr(t), time.Hour)
	}()
	<-done
	if !strings.Contains(ft.msg, "exited") || !strings.Contains(ft.msg, "no-port") {
		t.Fatalf("WaitTCP failed with %q, want the exit and the process's log", ft.msg)
	}
}

type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

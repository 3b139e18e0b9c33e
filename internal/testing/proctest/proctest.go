package proctest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/gobuild"
)

// ErrStillRunning is what Wait returns when the process outlives its timeout.
var ErrStillRunning = errors.New("proctest: process still running")

// binDirPrefix names the per-process directories of built binaries in
// os.TempDir(); the pid that follows lets a later test process remove the
// ones of processes that are gone.
const binDirPrefix = "idemgate-proctest-"

type build struct {
	once sync.Once
	path string
	err  error
}

var (
	builds     sync.Map // package path -> *build
	binDirOnce sync.Once
	binDir     string
	binDirErr  error
	binCount   int
	binCountMu sync.Mutex
)

// Build builds the main package pkg (an import path, or a path relative to
// the test's package directory) with go build and internal/gobuild's flags
// (static, -trimpath, no race detector), which every builder shares so that
// each dependency compiles once, and returns the binary's path.
// It builds each package once per test process: parallel tests share the
// binary. A failed build fails every test that asks for it.
//
// The binaries live in a directory of the test process in os.TempDir(),
// removed by the first Build of a later test process, as no cleanup can tell
// when the last test of this one is done.
func Build(tb testing.TB, pkg string) string {
	tb.Helper()
	v, _ := builds.LoadOrStore(pkg, &build{})
	b := v.(*build)
	b.once.Do(func() { b.path, b.err = goBuild(pkg) })
	if b.err != nil {
		tb.Fatalf("proctest: build %s: %v", pkg, b.err)
	}
	return b.path
}

func goBuild(pkg string) (string, error) {
	binDirOnce.Do(func() {
		removeLeftovers()
		binDir, binDirErr = os.MkdirTemp("", fmt.Sprintf("%s%d-*", binDirPrefix, os.Getpid()))
	})
	if binDirErr != nil {
		return "", binDirErr
	}
	binCountMu.Lock()
	binCount++
	// The counter keeps two packages with one base name apart.
	bin := filepath.Join(binDir, fmt.Sprintf("%d-%s", binCount, filepath.Base(pkg)))
	binCountMu.Unlock()
	if err := gobuild.Build(context.Background(), "", "", "-o", bin, pkg); err != nil {
		return "", err
	}
	return bin, nil
}

// removeLeftovers removes the binary directories of test processes that are
// gone.
func removeLeftovers() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), binDirPrefix+"*"))
	for _, dir := range dirs {
		pidText, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(dir), binDirPrefix), "-")
		pid, err := strconv.Atoi(pidText)
		if err == nil && pid != os.Getpid() && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			_ = os.RemoveAll(dir)
		}
	}
}

// Process is a running binary started by Start.
type Process struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // what cmd.Wait returned; set before done closes
}

// Start starts bin with args, in its own process group, its stdout and
// stderr appended to a log file in the test's temporary directory. env is
// added to the test process's environment: a later KEY=value wins, and KEY=
// empties KEY. When the test ends the process is killed, and if the test
// failed its log goes to the test log.
func Start(tb testing.TB, bin string, args []string, env []string) *Process {
	tb.Helper()
	logFile, err := os.CreateTemp(tb.TempDir(), filepath.Base(bin)+"-*.log")
	if err != nil {
		tb.Fatalf("proctest: %v", err)
	}
	// The child writes to its own copy of the descriptor.
	defer logFile.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		tb.Fatalf("proctest: start %s: %v", bin, err)
	}
	p := &Process{cmd: cmd, log: logFile.Name(), done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		p.Kill()
		if tb.Failed() {
			tb.Logf("proctest: log of %s (pid %d, %v):\n%s", filepath.Base(bin), p.Pid(), p.err, p.Log())
		}
	})
	return p
}

// Pid returns the process's id, also the id of its process group.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Kill sends SIGKILL to the process group and waits until the process has
// exited; a paused process dies too. Killing an exited process does nothing.
func (p *Process) Kill() {
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

// Pause stops the process group with SIGSTOP: it holds its sockets and
// locks but runs nothing, as a process stuck in a long GC pause or on a
// frozen VM would. On Linux it returns once every thread of the process has
// stopped (its children may still be stopping).
func (p *Process) Pause() error {
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	return waitStopped(p.Pid(), p.done)
}

// Resume continues a paused process group with SIGCONT.
func (p *Process) Resume() error { return p.Signal(syscall.SIGCONT) }

// Signal sends sig to the process group. It returns an error, and sends
// nothing, once the process has exited.
func (p *Process) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("proctest: signal %v: process %d has exited", sig, p.Pid())
	default:
	}
	return syscall.Kill(-p.Pid(), sig)
}

// Wait waits up to timeout for the process to exit and returns what it
// exited with: nil for status 0, an *exec.ExitError otherwise. It returns
// ErrStillRunning if the process outlives timeout.
func (p *Process) Wait(timeout time.Duration) error {
	select { // an exited process wins over a zero timeout
	case <-p.done:
		return p.err
	default:
	}
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		return ErrStillRunning
	}
}

// Log returns everything the process has written to stdout and stderr so far.
func (p *Process) Log() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	return string(b)
}

// WaitTCP waits up to timeout until addr accepts a TCP connection, and fails
// the test if it does not.
func WaitTCP(tb testing.TB, addr string, timeout time.Duration) {
	tb.Helper()
	if err := waitTCP(addr, timeout, nil); err != nil {
		tb.Fatalf("proctest: %v", err)
	}
}

// WaitTCP is the package's WaitTCP for an address p listens on: it fails the
// test at once, with p's log, if p exits first, rather than after timeout.
func (p *Process) WaitTCP(tb testing.TB, addr string, timeout time.Duration) {
	tb.Helper()
	if err := waitTCP(addr, timeout, p.done); err != nil {
		tb.Fatalf("proctest: %v\n%s", err, p.Log())
	}
}

func waitTCP(addr string, timeout time.Duration, exited <-chan struct{}) error {
	deadline := time.Now().Add(timeout)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return conn.Close()
		}
		select {
		case <-exited:
			return fmt.Errorf("the process exited before %s accepted a connection", addr)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s accepts no connection after %s: %v", addr, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WantCleanInterrupt sends the process SIGINT (Ctrl-C), fails the test
// unless it exits 0 within a minute, and fails it unless its log holds each
// of want in that order (a stopping line before a stopped one). The minute
// leaves room for a starved machine; a graceful stop takes milliseconds.
func (p *Process) WantCleanInterrupt(tb testing.TB, want ...string) {
	tb.Helper()
	if err := p.Signal(syscall.SIGINT); err != nil {
		tb.Fatal(err)
	}
	if err := p.Wait(time.Minute); err != nil {
		tb.Fatalf("after SIGINT: %v\n%s", err, p.Log())
	}
	log, at := p.Log(), 0
	for _, w := range want {
		i := strings.Index(log[at:], w)
		if i < 0 {
			tb.Errorf("log after SIGINT:\n%s\nwant %q, in this order after %q", log, w, want)
			return
		}
		at += i + len(w)
	}
}

// WantRefusedAtStart runs bin with args, which must make it refuse to
// start: it fails tb unless bin exits with status 1 and prints every one of
// want. A bin that starts instead is killed after a minute (reported as
// "signal: killed"), rather than holding the test to its timeout. It
// returns the output.
func WantRefusedAtStart(tb testing.TB, bin string, args []string, want ...string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		tb.Errorf("%s %s: %v, want exit status 1\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			tb.Errorf("%s %s: output\n%s\nwant %q", filepath.Base(bin), strings.Join(args, " "), out, w)
		}
	}
	return string(out)
}

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/internal/gobuild"
)

// server is a long-running child: a Dedupe service or a payments server.
type server struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // what cmd.Wait returned; set before done closes
}

// servers are the children started so far, stopped by stopAll.
var (
	serversMu sync.Mutex
	servers   []*server
)

// childEnv is this process's environment without the variables the
// binaries read, so a DATABASE_URL or IDEMGATE_* of the caller's shell
// cannot change what is measured: every setting is a flag.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "DATABASE_URL" || strings.HasPrefix(k, "IDEMGATE_") || strings.HasPrefix(k, "PAYMENTS_") || strings.HasPrefix(k, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// sysProcAttr puts a child in its own process group, so a terminal's
// interrupt reaches this process alone (which then stops the children in
// order), and has the kernel kill it if this process dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// startServer starts bin with args, its output in logPath.
func startServer(name, bin string, args []string, logPath string) (*server, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	s := &server{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		s.err = cmd.Wait()
		close(s.done)
	}()
	serversMu.Lock()
	servers = append(servers, s)
	serversMu.Unlock()
	return s, nil
}

// exited reports whether the server has exited, and how.
func (s *server) exited() (bool, error) {
	select {
	case <-s.done:
		return true, s.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the server's group, and SIGKILL if it has not
// exited 10s later.
func (s *server) stop() {
	if done, _ := s.exited(); done {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
}

// stopAll stops every server, the last started first (the payments
// servers before the Dedupe services they call).
func stopAll() {
	serversMu.Lock()
	defer serversMu.Unlock()
	for i := len(servers) - 1; i >= 0; i-- {
		start := time.Now()
		servers[i].stop()
		fmt.Fprintf(os.Stderr, "loadtest: %s stopped (%s)\n", servers[i].name, time.Since(start).Round(time.Millisecond))
	}
	servers = nil
}

// tail returns the last lines of the server's log, for an error message.
func (s *server) tail() string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// runTool runs a measuring tool (ghz, pgbench) to completion, its output in
// outPath, in its own process group, killed with its group if ctx ends, and
// returns the CPU time it used.
func runTool(ctx context.Context, outPath, bin string, args ...string) (time.Duration, error) {
	out, err := os.Create(outPath)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = filepath.Dir(outPath)
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(outPath)
		return 0, fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, b)
	}
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
}

// freeAddr returns a loopback address with a port nothing listens on now.
func freeAddr() (string, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer lis.Close()
	return lis.Addr().String(), nil
}

// buildBinaries builds the main packages into dir with go build and returns
// their paths in order.
func buildBinaries(ctx context.Context, dir string, pkgs ...string) ([]string, error) {
	var bins []string
	for _, pkg := range pkgs {
		bin := filepath.Join(dir, filepath.Base(pkg))
		if err := gobuild.Build(ctx, "", "", "-o", bin, pkg); err != nil {
			return nil, err
		}
		bins = append(bins, bin)
	}
	return bins, nil
}

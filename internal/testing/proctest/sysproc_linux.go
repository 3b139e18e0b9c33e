package proctest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// sysProcAttr puts the process in its own group, so signals reach its
// children too, and has the kernel kill it when the test process dies
// (a test timeout runs no cleanup).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// waitStopped waits until every thread of pid is stopped: kill(2) returns
// before SIGSTOP has reached them, and a thread still running could answer
// one more request.
func waitStopped(pid int, exited <-chan struct{}) error {
	deadline := time.Now().Add(time.Minute)
	for {
		stopped, err := allThreadsStopped(pid)
		if stopped {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("proctest: process %d exited while pausing", pid)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proctest: process %d not stopped a minute after SIGSTOP: %v", pid, err)
		}
		time.Sleep(time.Millisecond)
	}
}

func allThreadsStopped(pid int) (bool, error) {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return false, fmt.Errorf("no threads in /proc/%d/task: %v", pid, err)
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			return false, err
		}
		// The state follows the parenthesised command name, which may itself
		// contain ") ".
		i := bytes.LastIndex(b, []byte(") "))
		if i < 0 || i+2 >= len(b) {
			return false, fmt.Errorf("%s: unexpected %q", f, b)
		}
		if state := b[i+2]; state != 'T' && state != 't' {
			return false, fmt.Errorf("thread %s in state %c", filepath.Base(filepath.Dir(f)), state)
		}
	}
	return true, nil
}

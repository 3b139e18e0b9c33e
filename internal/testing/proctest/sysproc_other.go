//go:build unix && !linux

package proctest

import "syscall"

// sysProcAttr puts the process in its own group, so signals reach its
// children too.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// waitStopped cannot tell without /proc when SIGSTOP has taken effect.
func waitStopped(int, <-chan struct{}) error { return nil }

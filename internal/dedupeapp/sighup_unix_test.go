//go:build unix

package dedupeapp_test

import "syscall"

func sighup() error { return syscall.Kill(syscall.Getpid(), syscall.SIGHUP) }

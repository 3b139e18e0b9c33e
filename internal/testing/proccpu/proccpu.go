// Package proccpu reads the CPU time processes and PostgreSQL servers have
// used from /proc, for the load test and the benchmarks that report CPU
// per call: CPU time is what a loaded machine cannot bend, where throughput
// and latency move with whatever else runs.
package proccpu

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc/<pid>/stat's times (USER_HZ, sysconf
// _SC_CLK_TCK): 100 on every Linux architecture Go builds for, and the
// binary is built without cgo, which could ask.
const clockTick = 10 * time.Millisecond

// procStat is what proccpu reads of one /proc/<pid>/stat line.
type procStat struct {
	PPID int
	// UTime and STime are the process's own CPU time in user and kernel
	// mode, all its threads; CUTime and CSTime its children's that it has
	// waited for.
	UTime, STime, CUTime, CSTime time.Duration
}

// parseProcStat reads a /proc/<pid>/stat line. The command, field 2, is in
// parentheses and may hold spaces and parentheses itself, so the fields
// are counted from the last ')'.
func parseProcStat(line string) (procStat, error) {
	end := strings.LastIndexByte(line, ')')
	if end < 0 {
		return procStat{}, fmt.Errorf("stat line %q: no ')' after the command", line)
	}
	// After the command: state (field 3), ppid (4), ..., utime (14),
	// stime (15), cutime (16), cstime (17).
	f := strings.Fields(line[end+1:])
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("stat line %q: %d fields after the command, want 15 or more", line, len(f))
	}
	var nums [5]int64
	for i, idx := range []int{1, 11, 12, 13, 14} {
		n, err := strconv.ParseInt(f[idx], 10, 64)
		if err != nil || n < 0 {
			return procStat{}, fmt.Errorf("stat line %q: field %d is %q, want a count", line, idx+3, f[idx])
		}
		nums[i] = n
	}
	return procStat{
		PPID:  int(nums[0]),
		UTime: time.Duration(nums[1]) * clockTick, STime: time.Duration(nums[2]) * clockTick,
		CUTime: time.Duration(nums[3]) * clockTick, CSTime: time.Duration(nums[4]) * clockTick,
	}, nil
}

// Root is a directory of process files: /proc, or a test's copy.
type Root string

// stat reads the stat of pid.
func (r Root) stat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join(string(r), strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(string(b))
}

// ProcessCPU is the CPU time pid has used so far, all its threads.
func (r Root) ProcessCPU(pid int) (time.Duration, error) {
	s, err := r.stat(pid)
	if err != nil {
		return 0, fmt.Errorf("CPU of process %d: %w", pid, err)
	}
	return s.UTime + s.STime, nil
}

// ServerCPU is the CPU time used so far by the server whose postmaster is
// pid: its own, its live children's (the backends, the WAL writer, the
// checkpointer, autovacuum...) and that of the children it has reaped,
// which the kernel adds to its cutime and cstime when they exit. So the
// difference of two reads counts a backend that lived only between them
// too (a pgbench client's). A child that exits between the reading of the
// children and of the postmaster is counted twice, one that exits just
// before it is read and after the postmaster not at all: the error is one
// short-lived backend's CPU at a row's edge.
func (r Root) ServerCPU(pid int) (time.Duration, error) {
	entries, err := os.ReadDir(string(r))
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		s, err := r.stat(child)
		if errors.Is(err, fs.ErrNotExist) {
			continue // exited since the listing
		}
		if err != nil {
			return 0, err
		}
		if s.PPID == pid {
			total += s.UTime + s.STime
		}
	}
	s, err := r.stat(pid)
	if err != nil {
		return 0, fmt.Errorf("CPU of the server %d: %w", pid, err)
	}
	return total + s.UTime + s.STime + s.CUTime + s.CSTime, nil
}

// Proc is the machine's process files.
const Proc Root = "/proc"

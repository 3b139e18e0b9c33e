package proccpu

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// A postgres backend's title has spaces and parentheses; the fields
	// count from the last ')'. utime 250, stime 40, cutime 7, cstime 3 ticks.
	line := "4242 (postgres: postgres db 127.0.0.1(5432) idle) S 4100 4100 4100 0 -1 4194560 1234 0 0 0 250 40 7 3 20 0 1 0 5000 123456 789 18446744073709551615\n"
	got, err := parseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	want := procStat{PPID: 4100, UTime: 2500 * time.Millisecond, STime: 400 * time.Millisecond, CUTime: 70 * time.Millisecond, CSTime: 30 * time.Millisecond}
	if got != want {
		t.Errorf("parseProcStat = %+v, want %+v", got, want)
	}
	for _, bad := range []string{
		"",
		"4242 postgres S 1 2 3",
		"4242 (x) S 4100 4100",
		"4242 (x) S 4100 4100 4100 0 -1 4194560 1234 0 0 0 -5 40 7 3 20 0",
		"4242 (x) S 4100 4100 4100 0 -1 4194560 1234 0 0 0 ten 40 7 3 20 0",
	} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q) took it", bad)
		}
	}
}

// The real /proc: this process's CPU grows as it works.
func TestProcessCPUOfThisProcess(t *testing.T) {
	before, err := Proc.ProcessCPU(os.Getpid())
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	for start := time.Now(); time.Since(start) < 300*time.Millisecond; {
	}
	after, err := Proc.ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("CPU %v after 300ms of spinning, %v before", after, before)
	}
}

// writeStat writes a fake /proc/<pid>/stat under root.
func writeStat(t *testing.T, root string, pid, ppid int, utime, stime, cutime, cstime int) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	line := strconv.Itoa(pid) + " (postgres: a (b)) S " + strconv.Itoa(ppid) + " 1 1 0 -1 0 0 0 0 0 " +
		strconv.Itoa(utime) + " " + strconv.Itoa(stime) + " " + strconv.Itoa(cutime) + " " + strconv.Itoa(cstime) + " 20 0 1 0\n"
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A server's CPU is its postmaster's own and reaped children's, and its live
// children's; other processes' are not; a backend that lived and exited
// between two reads is counted through the postmaster's cutime.
func TestTreeCPU(t *testing.T) {
	root := t.TempDir()
	writeStat(t, root, 100, 1, 10, 5, 20, 10) // postmaster: 15 own, 30 reaped
	writeStat(t, root, 101, 100, 100, 50, 0, 0)
	writeStat(t, root, 102, 100, 7, 3, 0, 0)
	writeStat(t, root, 200, 1, 999, 999, 0, 0)   // another process
	writeStat(t, root, 201, 200, 999, 999, 0, 0) // its child
	if err := os.MkdirAll(filepath.Join(root, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := Root(root)
	before, err := r.ServerCPU(100)
	if err != nil {
		t.Fatal(err)
	}
	if want := (15 + 30 + 150 + 10) * clockTick; before != want {
		t.Fatalf("ServerCPU = %v, want %v", before, want)
	}
	// 102 exits (reaped: its 10 ticks join the cutime/cstime), 103 starts
	// and exits (40 ticks), 101 works 25 more.
	if err := os.RemoveAll(filepath.Join(root, "102")); err != nil {
		t.Fatal(err)
	}
	writeStat(t, root, 100, 1, 10, 5, 20+7+30, 10+3+10)
	writeStat(t, root, 101, 100, 120, 55, 0, 0)
	after, err := r.ServerCPU(100)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := after-before, (25+40)*clockTick; got != want {
		t.Errorf("CPU between the reads %v, want %v", got, want)
	}
	if _, err := r.ServerCPU(300); err == nil {
		t.Error("ServerCPU of a server that is gone: no error")
	}
}

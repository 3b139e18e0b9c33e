package main

import (
	"fmt"
	"time"

	"github.com/idemgate/idemgate/internal/testing/proccpu"
)

// The CPU a row costs each process is read from /proc before and after the
// row (proccpu).

// cpuRole names a process, or a PostgreSQL server and its children, whose
// CPU a row reads.
type cpuRole string

// The roles, in the order the report prints them.
const (
	roleTool    cpuRole = "tool server"
	roleService cpuRole = "dedupesvc"
	rolePG      cpuRole = "PostgreSQL"
	roleCoord   cpuRole = "coordinator"
	roleWorker1 cpuRole = "worker 1"
	roleWorker2 cpuRole = "worker 2"
	roleClient  cpuRole = "load generator"
)

var cpuRoles = []cpuRole{roleTool, roleService, rolePG, roleCoord, roleWorker1, roleWorker2, roleClient}

// cpuTarget is one process (tree false) or server (tree true) a row reads.
type cpuTarget struct {
	role cpuRole
	pid  int
	tree bool
}

// readCPU reads every target's CPU so far.
func readCPU(targets []cpuTarget) (map[cpuRole]time.Duration, error) {
	out := make(map[cpuRole]time.Duration, len(targets))
	for _, t := range targets {
		read := proccpu.Proc.ProcessCPU
		if t.tree {
			read = proccpu.Proc.ServerCPU
		}
		d, err := read(t.pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.role, err)
		}
		out[t.role] += d
	}
	return out, nil
}

// cpuBetween is each role's CPU between two reads; a role whose count went
// back (a process restarted) is left out.
func cpuBetween(before, after map[cpuRole]time.Duration) map[cpuRole]time.Duration {
	out := map[cpuRole]time.Duration{}
	for role, a := range after {
		if b, ok := before[role]; ok && a >= b {
			out[role] = a - b
		}
	}
	return out
}

// perThousand is CPU seconds per 1,000 calls: used over calls; false for
// no calls.
func perThousand(used time.Duration, calls int64) (float64, bool) {
	if calls <= 0 {
		return 0, false
	}
	return used.Seconds() / float64(calls) * 1000, true
}

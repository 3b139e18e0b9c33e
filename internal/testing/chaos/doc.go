// Package chaos is the chaos suite: it runs the real binaries (dedupesvc, the
// gated chaos-tool and the chaos-workload driver) on loopback, injects one
// fault per scenario while the workload retries through every layer that
// retries in real life, and checks the workload's history against the tool's
// crash-safe ledger of executions.
//
// The suite is TestChaos, run by `make chaos`; it skips unless -chaos is
// given. The layout borrows etcd's robustness tests' split: the scenarios and
// their faults (scenarios_test.go, run by suite_test.go), the traffic
// (cmd/chaos-workload), the ledger and history records (record.go) and the
// checker with its report (check.go). CHAOS.md at the repository root
// describes the scenarios and their results.
package chaos

package chaos

import (
	"errors"
	"time"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
)

// Stores a scenario runs the Dedupe service on.
const (
	StorePostgres = "postgres"
	StoreSQLite   = "sqlite"
)

// lease is the ChaosService methods' lease (proto/idemgate/testing/v1/chaos.proto).
const lease = 6 * time.Second

// Workload shapes a scenario's traffic: the fractions of actions sent to
// the REEXECUTE method, stalled at the tool's pause point, and failed
// ambiguously (DEADLINE_EXCEEDED after the side effect) on their first run.
type Workload struct {
	Reexecute, Pause, Ambiguous float64
	// TryTimeout is the retry interceptor's timeout per try; 0 means 10s.
	TryTimeout time.Duration
	// Spread is how long the actions' starts are spread over (ten times
	// longer with -chaos.long); 0 means 20s.
	Spread time.Duration
}

// Scenario is one fault against one topology, with the rules its faults
// make legitimate.
//
// To add a fault (a network toxic, a PostgreSQL failover), add a Scenario
// here: Setup runs before any process starts and may point Member.DedupeAddr
// at a proxy, or replace Stack.DatabaseURL with a failover pair's; Fault
// injects one outage while the workload runs and is called Outages times
// (ten times as often with -chaos.long), a second apart. Record a window in
// which the store was unreachable with Stack.outage, so the checker flags
// any handler that started in it.
type Scenario struct {
	// Name is the subtest's name: store/fault.
	Name string
	// Store is StorePostgres or StoreSQLite.
	Store string
	// OwnCluster gives the scenario a PostgreSQL cluster of its own, for
	// faults that stop it; others share one, each with its own database.
	OwnCluster bool
	// Replicas and Tools count the Dedupe replicas and tool servers; 0
	// means 1. Tool i dials replica i mod Replicas; the workload spreads
	// each action's callers over every tool.
	Replicas, Tools int
	// Workload shapes the traffic.
	Workload Workload
	// Outages is how many times Fault runs in a short run.
	Outages int
	// Setup, when set, rewires the stack before it starts.
	Setup func(*Stack)
	// Fault injects one outage; done closes when the workload has ended.
	Fault func(st *Stack, done <-chan struct{}) error
	// Rules are what the faults make legitimate.
	Rules Rules
	// Broken turns on chaos-tool's broken layer; ExpectViolations makes the
	// scenario pass only when the checker reports violations.
	Broken, ExpectViolations bool
}

// standard is the traffic of the core scenarios: spread over long enough
// for two outages of over a lease each.
var standard = Workload{Reexecute: 0.3, Pause: 0.25, Ambiguous: 0.05, Spread: 30 * time.Second}

// stalled is the standard traffic with tries that outlast a stopped tool
// server.
var stalled = Workload{Reexecute: 0.5, Pause: 0.3, Ambiguous: 0.05, TryTimeout: lease + 10*time.Second, Spread: 35 * time.Second}

// skipped turns errNoPause into a logged skip: the workload ended before a
// handler reached the pause point, which a short run may see.
func skipped(st *Stack, err error) error {
	if errors.Is(err, errNoPause) {
		st.T().Log("fault skipped: " + err.Error())
		return nil
	}
	return err
}

// killToolAtPausePoint SIGKILLs a tool server between a side effect and its
// Finish, and restarts it.
func killToolAtPausePoint(st *Stack, done <-chan struct{}) error {
	m, err := st.AtPausePoint(done, "")
	if err != nil {
		return skipped(st, err)
	}
	st.KillTool(m)
	return nil
}

// stallToolPastLease returns a fault that SIGSTOPs a tool server,
// mid-handler, for longer than the lease, while the workload's duplicates
// reach the other one: first under a REEXECUTE handler (a takeover), then under
// a FAIL_CLOSED one (an unknown that turns live again), alternately.
func stallToolPastLease() func(*Stack, <-chan struct{}) error {
	n := 0
	return func(st *Stack, done <-chan struct{}) error {
		n++
		method := testingv1.ChaosService_ChargeReexecute_FullMethodName
		if n%2 == 0 {
			method = testingv1.ChaosService_Charge_FullMethodName
		}
		m, err := st.AtPausePoint(done, method)
		if err != nil {
			return skipped(st, err)
		}
		return st.StallTool(m, lease+4*time.Second)
	}
}

// killDedupeAtPausePoint kills the first Dedupe replica for longer than the
// lease while a handler holds an unstored outcome.
func killDedupeAtPausePoint(st *Stack, done <-chan struct{}) error {
	if _, err := st.AtPausePoint(done, ""); err != nil {
		return skipped(st, err)
	}
	st.KillDedupe(st.Dedupes[0], lease+2*time.Second)
	return nil
}

// crashPostgresAtPausePoint stops PostgreSQL -m immediate for longer than
// the lease while a handler holds an unstored outcome.
func crashPostgresAtPausePoint(st *Stack, done <-chan struct{}) error {
	if _, err := st.AtPausePoint(done, ""); err != nil {
		return skipped(st, err)
	}
	st.CrashPostgres(lease + 2*time.Second)
	return nil
}

// replicaFaults alternates between killing a tool server at its pause point
// and killing the second Dedupe replica.
func replicaFaults() func(*Stack, <-chan struct{}) error {
	n := 0
	return func(st *Stack, done <-chan struct{}) error {
		n++
		if n%2 == 1 {
			return killToolAtPausePoint(st, done)
		}
		if _, err := st.AtPausePoint(done, ""); err != nil {
			return skipped(st, err)
		}
		st.KillDedupe(st.Dedupes[1], lease+2*time.Second)
		return nil
	}
}

// holderFaults are the rules of scenarios that kill or stall a holder.
var holderFaults = Rules{RerunAllowed: true, HolderFaults: true}

// scenarios lists the suite's scenarios; each call makes fresh fault state.
func scenarios() []Scenario {
	var list []Scenario
	for _, store := range []string{StorePostgres, StoreSQLite} {
		list = append(list,
			Scenario{Name: store + "/tool-killed-after-side-effect", Store: store, Workload: standard, Outages: 2,
				Fault: killToolAtPausePoint, Rules: holderFaults},
			// The stalled holder's callers wait out the stop (their tries
			// outlast it), so they get its answer after SIGCONT.
			Scenario{Name: store + "/tool-stopped-past-lease", Store: store, Tools: 2, Workload: stalled, Outages: 2,
				Fault: stallToolPastLease(), Rules: holderFaults},
			Scenario{Name: store + "/dedupe-killed", Store: store, Workload: standard, Outages: 2,
				Fault: killDedupeAtPausePoint},
		)
	}
	return append(list,
		Scenario{Name: StorePostgres + "/postgres-crashed", Store: StorePostgres, OwnCluster: true, Workload: standard, Outages: 2,
			Fault: crashPostgresAtPausePoint},
		Scenario{Name: StorePostgres + "/two-replicas-two-tools", Store: StorePostgres, Replicas: 2, Tools: 2, Workload: standard, Outages: 2,
			Fault: replicaFaults(), Rules: holderFaults},
		// The broken layer releases the key after an ambiguous failure, so
		// a retry charges again: the checker must see duplicates.
		Scenario{Name: StorePostgres + "/broken-interceptor", Store: StorePostgres, Workload: Workload{Ambiguous: 0.3}, Broken: true, ExpectViolations: true},
	)
}

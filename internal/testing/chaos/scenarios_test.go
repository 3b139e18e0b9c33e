package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/internal/testing/netfault"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// Stores a scenario runs the Dedupe service on.
const (
	StorePostgres = "postgres"
	StoreSQLite   = "sqlite"
	// StoreCitus is PostgreSQL on a Citus coordinator and two workers of
	// the scenario's own (citusStore).
	StoreCitus = "citus"
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
	// Actions is how many actions a short run sends (ten times as many with
	// -chaos.long); 0 means 30.
	Actions int
	// AmbiguousFailClosed is the least number of FAIL_CLOSED actions that
	// fail ambiguously (ten times as many with -chaos.long), whatever the
	// draw: chaos-workload -ambiguous-fail-closed. With at least one, a
	// gate that releases keys after an ambiguous failure shows a duplicate
	// in every seed (IDEMGATE_CHAOS_BROKEN_GATE=1). 0 means the draw alone.
	AmbiguousFailClosed int
	// Concurrency is the most actions in progress at once
	// (chaos-workload -concurrency); 0 means the workload's default, 24.
	Concurrency int
	// LateMetadata is the fraction of actions whose callers give up once
	// the side effect started, before the handler sets its response
	// metadata (LateMetadataSuffix); 0 means none.
	LateMetadata float64
	// DuplicatesAfter starts each action's first caller alone and the
	// others this long after it (chaos-workload -duplicates-after); 0 starts
	// them together.
	DuplicatesAfter time.Duration
	// Callers is how many concurrent callers each action has
	// (chaos-workload -callers); 0 means 3.
	Callers int
	// FirstToolFirst sends every action's first caller to the first tool
	// server, and caller k to tool k (mod the tools) (chaos-workload
	// -first-target 0); false spreads them over every tool.
	FirstToolFirst bool
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
	// Store is StorePostgres, StoreSQLite or StoreCitus.
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
	// Background, when set, runs beside the workload from its start until
	// it returns after done closes: faults set off by what the processes do
	// rather than at a pause point. The scenario is checked once it
	// returned; an error fails it.
	Background func(st *Stack, done <-chan struct{}) error
	// Rules are what the faults make legitimate.
	Rules Rules
	// Broken turns on chaos-tool's broken layer; ExpectViolations makes the
	// scenario pass only when the checker reports violations.
	Broken, ExpectViolations bool
	// Transport is how the workload's callers reach the tool servers:
	// TransportGRPC (or "") through the interceptor, TransportHTTP through
	// httpgate (each tool server also serves -http-listen, and the workload
	// runs with -transport http), TransportConnect through connectgate
	// (-connect-listen, -transport connect). Setup's caller-side proxies
	// apply to gRPC only.
	Transport string
	// MustSee are gate reasons (ErrorInfo's, or the problem's over HTTP)
	// the fault must make callers see at least once, or the run did not
	// test it (Report.RequireReasons); none by default.
	MustSee []string
	// Alone runs the scenario by itself, before the parallel ones start:
	// its traffic is the fault, or its check bounds a recovery in time, and
	// it needs the machine to itself (the 2,200-action crowd, beside three
	// other scenarios on 2 cores, left holders unable to store their
	// outcomes within their leases; so did a Citus node's restart under
	// load beside the other Citus scenarios). False by default.
	Alone bool
	// Spared, when above 0, is the least share of the tries on keys an
	// outage of some keys spared (a Citus worker down: the other worker's
	// keys) that must not be answered IDEMPOTENCY_STORE_UNAVAILABLE while
	// it lasts, with at least SparedTries of them (Report.RequireSpared).
	Spared      float64
	SparedTries int
	// CitusShards is the shards per distributed table of a StoreCitus
	// scenario's cluster; 0 means citustest.ShardCount.
	CitusShards int
	// RecoverWithin, when above 0, is how soon after each outage ended
	// every try on its keys must be served again (Report.RequireRecovered).
	RecoverWithin time.Duration
}

// standard is the traffic of the core scenarios: spread over long enough
// for two outages of over a lease each.
var standard = Workload{Reexecute: 0.3, Pause: 0.25, Ambiguous: 0.05, Spread: 30 * time.Second}

// crashUnderLoad is the traffic of postgres/crash-under-load, as issue 38
// item 2 found it: 800 actions over 40s (20 a second), 3 callers each,
// none held back by the workload's concurrency limit, a few pausing or
// failing ambiguously. With 6 callers each over 20s, both the batched
// follow-up and the one before it told callers outcome-unknown for keys
// that never ran (CHAOS.md, postgres/crash-under-load).
var crashUnderLoad = Workload{Reexecute: 0.3, Pause: 0.1, Ambiguous: 0.05, TryTimeout: 5 * time.Second, Spread: 40 * time.Second, Actions: 800, Concurrency: 800, Callers: 3}

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

// recovery is how long the store stays up after an outage before the next
// one. The holders' Finish retries must land in it: outages a second apart
// are one long outage, and one longer than the finish retry budget (a
// minute) loses outcomes by design (docs/failure-semantics.md, "When the store goes away"),
// which -chaos.long's twenty outages did.
const recovery = lease

// killDedupeAtPausePoint kills the first Dedupe replica for longer than the
// lease while a handler holds an unstored outcome.
func killDedupeAtPausePoint(st *Stack, done <-chan struct{}) error {
	if _, err := st.AtPausePoint(done, ""); err != nil {
		return skipped(st, err)
	}
	st.KillDedupe(st.Dedupes[0], lease+2*time.Second)
	st.sleep(recovery)
	return nil
}

// crashPostgresAtPausePoint stops PostgreSQL -m immediate for longer than
// the lease while a handler holds an unstored outcome.
func crashPostgresAtPausePoint(st *Stack, done <-chan struct{}) error {
	if _, err := st.AtPausePoint(done, ""); err != nil {
		return skipped(st, err)
	}
	st.CrashPostgres(lease + 2*time.Second)
	st.sleep(recovery)
	return nil
}

// lostBeginsAcrossSlowRecovery loses many Begins across a slow store
// recovery (issue 31 item 2): the first tool server's Dedupe replies are
// dropped for 2s (its Begins reserve keys whose answers never come back),
// then PostgreSQL stops -m immediate for longer than the lease, while every
// try at either tool server queues another lost Begin for follow-up (the
// service answers UNAVAILABLE, which cannot rule out a reservation), and
// the first tool server's replies come a quarter second late until a lease
// after the store is back. Each reservation whose answer was lost must be
// released within the lease the store grants once back: a duplicate
// through the other tool server never gets IDEMPOTENCY_OUTCOME_UNKNOWN for
// a handler that never ran, under the strict rules.
func lostBeginsAcrossSlowRecovery(st *Stack, done <-chan struct{}) error {
	m := st.Tools[0]
	start := time.Now()
	m.DedupeProxy.DropReplies()
	st.T().Logf("%s: Dedupe replies dropped for 2s", m.Name)
	st.sleep(2 * time.Second)
	m.DedupeProxy.Heal()
	m.DedupeProxy.Latency(250 * time.Millisecond)
	st.outage(m.Name+": Dedupe replies dropped", start, time.Now(), m.Name)
	st.CrashPostgres(lease + 4*time.Second)
	st.sleep(lease)
	m.DedupeProxy.Heal()
	st.T().Logf("%s: Dedupe replies on time again", m.Name)
	st.sleep(recovery)
	return nil
}

// lostBeginsCrowd loses a crowd of Begins (issue 38 item 1): the first
// tool server's Dedupe replies are dropped for 1.2s a second into a
// workload whose every first caller goes to it, about 1,000 actions a
// second, so about 1,200 first Begins reserve keys whose answers never come
// back; each action's other callers come a lease and a second later, one
// through the other tool server and one through this one. Every
// reservation whose answer was lost must be freed before its lease runs
// out: no caller gets IDEMPOTENCY_OUTCOME_UNKNOWN for a handler that never
// ran (the checker's "false unknown"), under the strict rules. The
// follow-ups before ReleaseLostBegins took 250 a second one by one and
// dropped those past 1,024 queued; with a 3s lease, 113, 51 and 17 keys of
// 480 were told so on a loaded machine.
func lostBeginsCrowd(st *Stack, done <-chan struct{}) error {
	m := st.Tools[0]
	start := time.Now()
	m.DedupeProxy.DropReplies()
	st.T().Logf("%s: Dedupe replies dropped for 1.2s", m.Name)
	st.sleep(1200 * time.Millisecond)
	m.DedupeProxy.Heal()
	st.outage(m.Name+": Dedupe replies dropped", start, time.Now(), m.Name)
	st.sleep(recovery)
	return nil
}

// crashUnderLoadAt is how long into the workload crashPostgresUnderLoad
// stops PostgreSQL (the suite calls a fault a second after the workload
// starts), and crashUnderLoadFor how long it keeps it down: the issue's
// 11.7s, about two leases.
const (
	crashUnderLoadAt  = 5 * time.Second
	crashUnderLoadFor = 11700 * time.Millisecond
)

// crashPostgresUnderLoad is a plain PostgreSQL crash under load (issue 38
// item 2): a few seconds into a steady stream of actions, not at a pause
// point, PostgreSQL stops -m immediate for 11.7s, then recovers. Every try
// meanwhile is answered UNAVAILABLE by a service that cannot rule out a
// reservation, so each is a lost Begin the gate must free once the store
// is back; Begins in flight when the store goes away may also have
// committed just before. Under the strict rules, no caller may be told
// IDEMPOTENCY_OUTCOME_UNKNOWN for a key whose handler never ran: with 800
// actions, 3 callers each, 20 a second through two tool servers, 2 such
// keys were left so, and 9 on a machine with a load of about 11.
func crashPostgresUnderLoad(st *Stack, done <-chan struct{}) error {
	if !st.sleep(crashUnderLoadAt - time.Second) {
		return nil
	}
	st.CrashPostgres(crashUnderLoadFor)
	st.sleep(recovery)
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
		st.sleep(recovery)
		return nil
	}
}

// storeAwayReasons are what callers must see when the store goes away
// (the Dedupe service or PostgreSQL down, or a tool server cut off from its
// replica) for longer than a Begin waits: new calls refused, the store
// unavailable.
var storeAwayReasons = []string{reasonStoreUnavailable}

// holderFaults are the rules of scenarios that kill or stall a holder.
var holderFaults = Rules{RerunAllowed: true, HolderFaults: true}

// holderCutOff are the rules of scenarios that cut a holder off from the
// store: as holderFaults, and its caller may get the response whose Finish
// did not get through while a REEXECUTE taker stores another.
var holderCutOff = Rules{RerunAllowed: true, HolderFaults: true, HolderCutOff: true}

// networked is the traffic of the network scenarios: more actions, more of
// them pausing and half REEXECUTE, so each fault finds a handler at the
// pause point of the method it needs; short tries, so delayed replies come
// after the callers gave up. Spread is set per scenario, to outlast its
// faults.
var networked = Workload{Reexecute: 0.5, Pause: 0.6, Ambiguous: 0.05, TryTimeout: 5 * time.Second, Actions: 40}

// breakable is w with an ambiguous FAIL_CLOSED action in every seed, so
// the scenario fails under a broken gate whatever the seed.
func breakable(w Workload) Workload {
	w.AmbiguousFailClosed = 1
	return w
}

// spreadOver is w spread over d.
func spreadOver(w Workload, d time.Duration) Workload {
	w.Spread = d
	return w
}

// netFault is one network fault: apply puts it on a proxy for hold, then
// Heal takes it off. away says the fault keeps every answer from the far
// side: behind a Dedupe-side proxy, the store is unreachable meanwhile.
type netFault struct {
	name  string
	hold  time.Duration
	away  bool
	apply func(*netfault.Proxy)
}

// callerSideFaults are the faults between the callers and a tool server:
// replies that come after the callers gave up (tryTimeout is the
// workload's), replies lost, a partition past the lease and connections
// reset. Each but the partition is held just long enough to catch the paused
// handler's reply (it returns 3s after its side effect). The holder is never
// harmed.
func callerSideFaults(tryTimeout time.Duration) []netFault {
	return []netFault{
		{name: "replies delayed past the try timeout", hold: 4 * time.Second, apply: func(p *netfault.Proxy) { p.Latency(tryTimeout + 2*time.Second) }},
		{name: "replies dropped", hold: 4 * time.Second, apply: (*netfault.Proxy).DropReplies},
		{name: "blackhole past the lease", hold: lease + 4*time.Second, apply: (*netfault.Proxy).Blackhole},
		{name: "connections reset", hold: 4 * time.Second, apply: (*netfault.Proxy).Reset},
	}
}

// dedupeSideFaults are the faults between a tool server and its Dedupe
// replica: the holder cut off past its lease (a blackhole), answers lost
// while requests arrive (the lease is renewed, Begin and Finish answers are
// lost), connections reset past the lease, and answers slower than the
// heartbeat's timeout but within Begin's and Finish's.
func dedupeSideFaults() []netFault {
	return []netFault{
		{name: "blackhole past the lease", hold: lease + 4*time.Second, away: true, apply: (*netfault.Proxy).Blackhole},
		{name: "replies dropped", hold: lease + 2*time.Second, away: true, apply: (*netfault.Proxy).DropReplies},
		{name: "connections reset past the lease", hold: lease + 2*time.Second, away: true, apply: (*netfault.Proxy).Reset},
		{name: "replies delayed 4s", hold: lease, apply: func(p *netfault.Proxy) { p.Latency(4 * time.Second) }},
	}
}

// proxyCallers puts a proxy between the workload and each tool server.
func proxyCallers(st *Stack) {
	for _, tool := range st.Tools {
		tool.CallerProxy = netfault.NewProxy(st.T(), tool.Addr)
		tool.CallerAddr = tool.CallerProxy.Addr()
	}
}

// proxyDedupe puts a proxy between each tool server and its Dedupe replica.
func proxyDedupe(st *Stack) {
	for _, tool := range st.Tools {
		tool.DedupeProxy = netfault.NewProxy(st.T(), tool.DedupeAddr)
		tool.DedupeAddr = tool.DedupeProxy.Addr()
	}
}

// networkFaults returns a fault that waits for a handler at the pause point,
// alternately of a REEXECUTE and a FAIL_CLOSED method (swapped on each pass
// over faults, so each fault meets both), and puts the next of faults on that tool server's proxy (the caller-side one, or with
// dedupeSide the one to its Dedupe replica). A fault that keeps the store
// away from the tool server is recorded as an outage for it.
func networkFaults(dedupeSide bool, faults []netFault) func(*Stack, <-chan struct{}) error {
	n := 0
	return func(st *Stack, done <-chan struct{}) error {
		f := faults[n%len(faults)]
		method := testingv1.ChaosService_ChargeReexecute_FullMethodName
		if (n+n/len(faults))%2 == 1 {
			method = testingv1.ChaosService_Charge_FullMethodName
		}
		n++
		m, err := st.AtPausePoint(done, method)
		if err != nil {
			return skipped(st, err)
		}
		p, side := m.CallerProxy, "callers"
		if dedupeSide {
			p, side = m.DedupeProxy, "Dedupe"
		}
		start := time.Now()
		f.apply(p)
		st.T().Logf("%s: %s between %s and %s for %s", m.Name, f.name, m.Name, side, f.hold)
		st.sleep(f.hold)
		p.Heal()
		if dedupeSide && f.away {
			st.outage(fmt.Sprintf("%s: %s to Dedupe", m.Name, f.name), start, time.Now(), m.Name)
		}
		return nil
	}
}

// replicatedStore starts a primary with a synchronous standby and points the
// Dedupe service at both through the multi-host URL, which reaches whichever
// accepts writes.
func replicatedStore(st *Stack) {
	t := st.T()
	st.Replicated = pgtest.NewReplicatedCluster(t)
	ctx, cancel := context.WithTimeout(st.ctx, patience)
	defer cancel()
	conn, err := pgx.Connect(ctx, st.Replicated.Primary().URL("postgres"))
	if err != nil {
		t.Fatalf("connect to the primary: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE chaos"); err != nil {
		t.Fatalf("create database chaos: %v", err)
	}
	st.DatabaseURL = st.Replicated.URL("chaos")
	t.Logf("replicated PostgreSQL: %s", st.Replicated)
}

// failoverAtPausePoint kills the primary while a handler holds an unstored
// outcome, keeps the store away past the lease, and promotes the standby;
// the Dedupe service must find it on its own. There is one standby, so only
// the first call fails over; later ones (-chaos.long) do nothing.
func failoverAtPausePoint(st *Stack, done <-chan struct{}) error {
	if st.failedOver {
		return nil
	}
	if _, err := st.AtPausePoint(done, ""); err != nil {
		return skipped(st, err)
	}
	st.Replicated.KillPrimary(st.T())
	downAt := time.Now()
	st.T().Logf("primary killed (-m immediate); promoting the standby in %s", lease+2*time.Second)
	st.sleep(lease + 2*time.Second)
	// The store may take writes as soon as pg_ctl promote runs, before
	// Promote sees it does: the window ends when promotion starts.
	upAt := time.Now()
	st.Replicated.Promote(st.T())
	st.failedOver = true
	st.T().Log("standby promoted")
	st.outage("PostgreSQL primary killed, standby promoted", downAt, upAt)
	return nil
}

// patroniConfig is the Patroni configuration docs/high-availability.md
// documents; the Patroni scenario runs it as it is.
const patroniConfig = "../../../deploy/patroni/patroni.yml"

// patroniStore starts three PostgreSQL nodes under Patroni (synchronous
// mode, strict) and points the Dedupe service at all of them through the
// multi-host URL, which reaches whichever leads.
func patroniStore(st *Stack) {
	t := st.T()
	st.Patroni = pgtest.NewPatroni(t, patroniConfig)
	ctx, cancel := context.WithTimeout(st.ctx, patience)
	defer cancel()
	conn, err := pgx.Connect(ctx, st.Patroni.URL("postgres"))
	if err != nil {
		t.Fatalf("connect to the Patroni leader: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE chaos"); err != nil {
		t.Fatalf("create database chaos: %v", err)
	}
	// The multi-host URL may reach a replica first, which must have the
	// database too: pgx tries no further host after its FATAL.
	st.Patroni.WaitDatabase(t, "chaos")
	st.DatabaseURL = st.Patroni.URL("chaos")
	t.Logf("%s", st.Patroni)
}

// patroniFaultsAtPausePoint alternates, each while a handler holds an
// unstored outcome: the leader's machine crashes (Patroni and PostgreSQL
// killed; the synchronous standby is promoted once the leader key expires,
// and the crashed node rejoins as a replica), then a planned switchover to
// the synchronous standby. The Dedupe service must find the new leader on
// its own and nothing acknowledged may be lost: the strict rules hold.
func patroniFaultsAtPausePoint(st *Stack, done <-chan struct{}) error {
	if _, err := st.AtPausePoint(done, ""); err != nil {
		return skipped(st, err)
	}
	t := st.T()
	downAt := time.Now()
	if st.patroniFaults++; st.patroniFaults%2 == 1 {
		crashed := st.Patroni.CrashLeader(t)
		leader, _ := st.Patroni.WaitHealthy(t, crashed)
		t.Logf("Patroni: %s crashed, %s leads after %s", crashed, leader, time.Since(downAt).Round(time.Millisecond))
		// No node can take writes until the crashed leader's key expires,
		// ttl after its last renewal, at most loop_wait before the crash;
		// when a standby starts taking them after that, only Patroni knows.
		st.outage("Patroni leader's machine crashed, until its leader key can first expire", downAt, downAt.Add(patroniCertainlyAway))
		st.Patroni.Restart(t, crashed)
		return nil
	}
	// The old leader takes writes until Patroni demotes it and the new one
	// from its promotion: no window in which the store is certainly away.
	from, to := st.Patroni.Switchover(t)
	t.Logf("Patroni: switched over from %s to %s in %s", from, to, time.Since(downAt).Round(time.Millisecond))
	return nil
}

// patroniCertainlyAway is how long after a crash of the Patroni leader no
// node can take writes: ttl (10s) less loop_wait (1s) in
// deploy/patroni/patroni.yml, less a second for a renewal in flight.
const patroniCertainlyAway = 8 * time.Second

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
				Fault: killDedupeAtPausePoint, MustSee: storeAwayReasons},
		)
	}
	list = append(list,
		Scenario{Name: StorePostgres + "/postgres-crashed", Store: StorePostgres, OwnCluster: true, Workload: standard, Outages: 2,
			Fault: crashPostgresAtPausePoint, MustSee: storeAwayReasons},
		restartScenario(),
		// Hundreds of lost Begins queued for follow-up across a PostgreSQL
		// crash longer than the lease and a slow recovery; the strict
		// rules: no outcome-unknown for a key whose handler never ran.
		Scenario{Name: StorePostgres + "/lost-begins-slow-recovery", Store: StorePostgres, OwnCluster: true, Tools: 2,
			Workload: Workload{Reexecute: 0.3, TryTimeout: 5 * time.Second, Spread: 12 * time.Second, Actions: 150, Concurrency: 96}, Outages: 1,
			Setup: proxyDedupe, Fault: lostBeginsAcrossSlowRecovery, MustSee: storeAwayReasons},
	)
	// A plain PostgreSQL crash under load (issue 38 item 2): 20 actions a
	// second through two tool servers, every action in progress at once,
	// PostgreSQL down 11.7s once; the strict rules.
	list = append(list, Scenario{Name: StorePostgres + "/crash-under-load", Store: StorePostgres, OwnCluster: true, Tools: 2,
		Workload: crashUnderLoad, Outages: 1, Fault: crashPostgresUnderLoad, MustSee: storeAwayReasons, RecoverWithin: 10 * time.Second})
	// A crowd of lost Begins freed before their leases run out (issue 38
	// item 1): all first callers through the first tool server, their
	// duplicates a lease later; 480 actions over 1.2s, as the issue found,
	// and 2,200 over 2.2s.
	for _, crowd := range []struct {
		name    string
		actions int
		spread  time.Duration
	}{{"lost-begins-crowd-480", 480, 1200 * time.Millisecond}, {"lost-begins-crowd", 2200, 2200 * time.Millisecond}} {
		list = append(list, Scenario{Name: StorePostgres + "/" + crowd.name, Store: StorePostgres, Tools: 2,
			Workload: Workload{Reexecute: 0.3, TryTimeout: 5 * time.Second, Spread: crowd.spread, Actions: crowd.actions, Concurrency: crowd.actions,
				DuplicatesAfter: lease + time.Second, FirstToolFirst: true}, Outages: 1,
			Setup: proxyDedupe, Fault: lostBeginsCrowd, Alone: crowd.actions > 1000})
	}
	// The store on Citus: a worker killed -9 and restarted, a shard moved
	// (issue 33).
	list = append(list, citusScenarios()...)
	// A holder's first Finish lost, then the holder cut off past its lease
	// (issue 31 item 1).
	list = append(list, firstFinishLostScenarios()...)
	list = append(list,
		// Killing the second replica cuts its tool server's holders off from
		// a store that stays up for the other one, which takes over after
		// the lease (docs/failure-semantics.md, "When the store goes away").
		Scenario{Name: StorePostgres + "/two-replicas-two-tools", Store: StorePostgres, Replicas: 2, Tools: 2, Workload: standard, Outages: 2,
			Fault: replicaFaults(), Rules: holderCutOff},
		// Callers lose replies, get them late or not at all, and lose their
		// connections; the holders are never harmed, so the strict rules hold.
		Scenario{Name: StorePostgres + "/network-caller-side", Store: StorePostgres, Tools: 2, Workload: spreadOver(networked, 45*time.Second), Outages: 5,
			Setup: proxyCallers, Fault: networkFaults(false, callerSideFaults(networked.TryTimeout))},
		// A holder is cut off from its Dedupe replica, loses its answers or
		// gets them late, while its duplicates reach the other tool server.
		Scenario{Name: StorePostgres + "/network-dedupe-side", Store: StorePostgres, Tools: 2, Workload: spreadOver(networked, 60*time.Second), Outages: 5,
			Setup: proxyDedupe, Fault: networkFaults(true, dedupeSideFaults()), Rules: holderCutOff, MustSee: storeAwayReasons},
		// The store fails over: no acknowledged reservation or outcome may
		// be lost, so the strict rules hold.
		Scenario{Name: StorePostgres + "/postgres-failover", Store: StorePostgres, Workload: standard, Outages: 1,
			Setup: replicatedStore, Fault: failoverAtPausePoint},
		// The store is PostgreSQL under Patroni with a synchronous
		// standby (deploy/patroni/patroni.yml): a crash of the leader's
		// machine, then a switchover, each with an outcome in flight.
		Scenario{Name: StorePostgres + "/patroni-failover-and-switchover", Store: StorePostgres, Workload: standard, Outages: 2,
			Setup: patroniStore, Fault: patroniFaultsAtPausePoint},
		// Every caller of a late-metadata action gives up on its first try
		// once the side effect started; the handler then sets its header
		// and trailer on a finished stream. No fault: the strict rules, and
		// every answer must carry the metadata.
		Scenario{Name: StorePostgres + "/caller-gives-up-before-metadata", Store: StorePostgres, Tools: 2,
			Workload: Workload{Reexecute: 0.3, LateMetadata: 0.6}},
		// The broken layer releases the key after an ambiguous failure, so
		// a retry charges again: the checker must see duplicates.
		Scenario{Name: StorePostgres + "/broken-interceptor", Store: StorePostgres, Workload: Workload{Ambiguous: 0.3}, Broken: true, ExpectViolations: true},
		// The HTTP gate (httpgate), its callers on net/http: the tool
		// server killed between side effect and return, as
		// tool-killed-after-side-effect.
		Scenario{Name: StorePostgres + "/http-tool-killed-after-side-effect", Store: StorePostgres, Transport: TransportHTTP, Workload: standard, Outages: 2,
			Fault: killToolAtPausePoint, Rules: holderFaults},
		// The Dedupe service killed past the lease under the HTTP gate, as
		// dedupe-killed: the strict rules.
		Scenario{Name: StorePostgres + "/http-dedupe-killed", Store: StorePostgres, Transport: TransportHTTP, Workload: standard, Outages: 2,
			Fault: killDedupeAtPausePoint, MustSee: storeAwayReasons},
		// The HTTP handler marks every failure retryable (the broken
		// layer's counterpart), so the gate releases the key after an
		// ambiguous failure: the checker must see duplicates.
		Scenario{Name: StorePostgres + "/http-broken-gate", Store: StorePostgres, Transport: TransportHTTP, Workload: Workload{Ambiguous: 0.3}, Broken: true, ExpectViolations: true},
		// The Connect gate (connectgate), its callers on connect-go's
		// client: the tool server killed between side effect and return.
		Scenario{Name: StorePostgres + "/connect-tool-killed-after-side-effect", Store: StorePostgres, Transport: TransportConnect, Workload: standard, Outages: 2,
			Fault: killToolAtPausePoint, Rules: holderFaults},
		// A Connect interceptor inside the gate marks every handler error
		// retryable: the checker must see duplicates.
		Scenario{Name: StorePostgres + "/connect-broken-gate", Store: StorePostgres, Transport: TransportConnect, Workload: Workload{Ambiguous: 0.3}, Broken: true, ExpectViolations: true},
		// The Dedupe service killed past the lease under the Connect gate,
		// as dedupe-killed: the strict rules.
		Scenario{Name: StorePostgres + "/connect-dedupe-killed", Store: StorePostgres, Transport: TransportConnect, Workload: breakable(standard), Outages: 2,
			Fault: killDedupeAtPausePoint, MustSee: storeAwayReasons},
	)
	// The store outage and the partition through the HTTP and Connect
	// gates: the gRPC scenarios' faults and rules, the callers on the other
	// transport.
	for _, transport := range []string{TransportHTTP, TransportConnect} {
		list = append(list,
			Scenario{Name: StorePostgres + "/" + transport + "-postgres-crashed", Store: StorePostgres, OwnCluster: true, Transport: transport, Workload: breakable(standard), Outages: 2,
				Fault: crashPostgresAtPausePoint, MustSee: storeAwayReasons},
			Scenario{Name: StorePostgres + "/" + transport + "-network-dedupe-side", Store: StorePostgres, Tools: 2, Transport: transport, Workload: breakable(spreadOver(networked, 60*time.Second)), Outages: 5,
				Setup: proxyDedupe, Fault: networkFaults(true, dedupeSideFaults()), Rules: holderCutOff, MustSee: storeAwayReasons},
		)
	}
	return list
}

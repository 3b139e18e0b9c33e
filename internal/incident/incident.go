// Package incident replays the double-charge incident idemgate grew from (a
// slow charge timed out, the framework retried, the card was charged twice): a
// simulated agent runtime takes orders, each a ChargeCard then a SendReceipt
// against the example payments tool, through the three retry sources the tool
// never sees — a client timeout after the work succeeded, a framework's
// auto-retry on any error, and the model calling again to be sure — once
// without idemgate and once with it, and counts the side effects.
//
// Every random draw comes from a generator seeded per order and made before
// any call, so the same seed gives the same workload in every scenario and
// in every run, whatever the goroutine schedule. Nor does the result depend
// on the machine's speed: a slow response is one the client gives up on by
// construction (the simulated provider holds its answer until the client has
// timed out), not a wall-clock race between a timer and a starved scheduler,
// so an idle laptop and a loaded CI machine print the same table.
package incident

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// Config is one replay. Zero fields take their defaults.
type Config struct {
	// Orders is how many orders the runtime takes. Defaults to 300.
	Orders int
	// Seed makes the run reproducible. Defaults to 1.
	Seed uint64
	// Concurrency is how many orders run at once. Defaults to 16.
	Concurrency int
	// SlowRate is the chance that a call's response is slow: the provider
	// acts, then answers only after the client has timed out and given up
	// on the call (which the client then retries). Simulated, so it takes
	// no wall-clock time and no machine is too slow or too fast for it.
	// Defaults to 0.06.
	SlowRate float64
	// LostRate is the chance that a response is lost after the side effect
	// ran (the framework sees an error). Defaults to 0.04.
	LostRate float64
	// ReemitRate is the chance that the model calls a tool again after it
	// succeeded, to be sure. Defaults to 0.05.
	ReemitRate float64
	// FrameworkRetries is how often the framework retries a failed call.
	// Defaults to 2.
	FrameworkRetries int
	// CallDeadline bounds each call in wall-clock time, a backstop against
	// a hung replay only: no call of a healthy run comes near it, however
	// loaded the machine. A call that reaches it fails, and an action whose
	// every attempt fails counts as not done. Defaults to 1 minute.
	CallDeadline time.Duration
	// DatabaseURL runs the dedupe service on PostgreSQL; empty uses the
	// embedded store in DataDir.
	DatabaseURL string
	// DataDir holds the embedded store. Required when DatabaseURL is empty.
	DataDir string

	stall           time.Duration      // tests: every call waits this long before it runs, as on a starved machine
	serviceDefaults []dedupesvc.Option // tests: the Dedupe service's options before the demo's own
}

func (c *Config) defaults() {
	if c.Orders == 0 {
		c.Orders = 300
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Concurrency == 0 {
		c.Concurrency = 16
	}
	if c.SlowRate == 0 {
		c.SlowRate = 0.06
	}
	if c.LostRate == 0 {
		c.LostRate = 0.04
	}
	if c.ReemitRate == 0 {
		c.ReemitRate = 0.05
	}
	if c.FrameworkRetries == 0 {
		c.FrameworkRetries = 2
	}
	if c.CallDeadline == 0 {
		c.CallDeadline = time.Minute
	}
}

// Scenario is one row of the report.
type Scenario struct {
	// Name describes the row.
	Name string
	// Actions is how many logical actions the runtime meant to take.
	Actions int
	// Calls is how many tool calls were sent, retries and re-emissions included.
	Calls int64
	// Executed is how many side effects ran.
	Executed int64
	// Duplicates is how many side effects ran beyond one per action.
	Duplicates int64
	// Replays is how many calls got a stored outcome instead of a run.
	Replays int64
	// NotDone is how many actions the runtime gave up on: every attempt
	// failed, or (a receipt) the charge it needed was not done.
	NotDone int
	// Errors counts the calls that failed for good (an action's last
	// attempt, or a model's re-emission), by reason.
	Errors map[string]int
	// Unexpected counts, by reason, those of Errors the simulation did not
	// cause (a slow response the client gave up on, a lost response): a
	// refusal by the gate or the Dedupe service, a broken connection. Any
	// means the run measured something other than the incident, and the
	// demo fails.
	Unexpected map[string]int
	// Unexplained lists the actions that are neither done as this row
	// promises nor reported not done: with idemgate and orchestration keys,
	// an action that succeeded but whose side effect did not run exactly
	// once, or that failed after running more than once. Any entry means
	// the replay's numbers cannot be trusted, and the demo fails.
	Unexplained []string
}

// Report is the outcome of a replay.
type Report struct {
	// Config is the configuration the replay ran with, defaults applied.
	Config Config
	// Ungated ran without the interceptor.
	Ungated Scenario
	// Gated ran with it, the model re-emitting with the orchestration's key.
	Gated Scenario
	// FreshKey ran with it, the model re-emitting with a key it made up.
	FreshKey Scenario
	// Elapsed is how long the replay took.
	Elapsed time.Duration
}

// Problems returns why the demo must fail, empty when it must not: an
// action neither done as its row promises nor reported not done, a
// duplicate with idemgate and orchestration keys, a call that failed for a
// reason the simulation did not cause, or a run with the README's
// configuration (the first line of DefaultTable) whose numbers are not
// DefaultTable's.
func (r Report) Problems() []string {
	out := r.Unexplained()
	if r.Gated.Duplicates > 0 {
		out = append(out, fmt.Sprintf("%s: %d duplicate side effects", r.Gated.Name, r.Gated.Duplicates))
	}
	for _, s := range []Scenario{r.Ungated, r.Gated, r.FreshKey} {
		if len(s.Unexpected) > 0 {
			out = append(out, fmt.Sprintf("%s: calls failed for reasons the simulation did not cause: %s", s.Name, errorsText(s.Unexpected)))
		}
	}
	table := r.Table()
	config, _, _ := strings.Cut(DefaultTable, "\n")
	if strings.HasPrefix(table, config+"\n") && table != DefaultTable {
		out = append(out, "the default run's table is not the one README.md shows (incident.DefaultTable)")
	}
	return out
}

// DefaultTable is the table a run with the default configuration prints,
// as README.md shows it: the replay is deterministic and does not depend on
// the store or the machine's speed, so any other table is a broken run.
const DefaultTable = `300 orders (ChargeCard + SendReceipt each), seed 1: slow responses 6% (the client times out), lost responses 4%, model re-emits 5%, 2 framework retries

scenario                                      actions  calls  side effects  duplicates  replays  not done  errors by reason
without idemgate                                  600    706           706         106        0         0  none
idemgate, key from the orchestration layer        600    704           600           0      104         0  none
idemgate, model re-emits with its own key         600    704           641          41       63         0  none
`

// Unexplained returns every row's unexplained actions, each prefixed with
// its row's name.
func (r Report) Unexplained() []string {
	var out []string
	for _, s := range []Scenario{r.Ungated, r.Gated, r.FreshKey} {
		for _, u := range s.Unexplained {
			out = append(out, s.Name+": "+u)
		}
	}
	return out
}

// keying is how a scenario's model keys its re-emissions, and what the row
// promises about side effects.
type keying int

const (
	ungated      keying = iota // no gate: anything goes, duplicates are the point
	orchestrated               // the gate, one key per action: each action runs at most once
	freshModel                 // the gate, the model's own key on re-emission: at most twice
)

// Run replays the incident three times: without idemgate, with it, and with
// it while the model makes up its own keys.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg.defaults()
	start := time.Now()
	plan := makePlan(cfg)
	dedupe, stop, err := startDedupe(ctx, cfg)
	if err != nil {
		return Report{}, err
	}
	defer stop()

	r := Report{Config: cfg}
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	if r.Ungated, err = runScenario(ctx, cfg, plan, "without idemgate", nil, ungated); err != nil {
		return r, err
	}
	if r.Gated, err = runScenario(ctx, cfg, plan, "idemgate, key from the orchestration layer", gateFor(dedupe, runID+"-a", cfg), orchestrated); err != nil {
		return r, err
	}
	if r.FreshKey, err = runScenario(ctx, cfg, plan, "idemgate, model re-emits with its own key", gateFor(dedupe, runID+"-b", cfg), freshModel); err != nil {
		return r, err
	}
	r.Elapsed = time.Since(start)
	return r, nil
}

// attempt is what happens to one call attempt.
type attempt struct{ slow, lost bool }

// action is one tool call the runtime means to make, with its fate drawn.
type action struct {
	attempts []attempt // one per framework attempt
	reemit   bool
}

// order is one order's two actions and its amount.
type order struct {
	customer       string
	amount         int64
	charge, notify action
}

func makePlan(cfg Config) []order {
	plan := make([]order, cfg.Orders)
	for i := range plan {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
		draw := func() action {
			a := action{attempts: make([]attempt, 1+cfg.FrameworkRetries)}
			for j := range a.attempts {
				a.attempts[j] = attempt{slow: rng.Float64() < cfg.SlowRate, lost: rng.Float64() < cfg.LostRate}
			}
			a.reemit = rng.Float64() < cfg.ReemitRate
			return a
		}
		plan[i] = order{customer: fmt.Sprintf("cust_%04d", i), amount: 100 + rng.Int64N(9900), charge: draw(), notify: draw()}
	}
	return plan
}

// startDedupe runs the Dedupe service on loopback over the configured store.
func startDedupe(ctx context.Context, cfg Config) (idemgatev1.DedupeServiceClient, func(), error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var (
		store    dedupesvc.Store
		notifier dedupesvc.Notifier
		closers  []func()
	)
	if cfg.DatabaseURL == "" {
		s, err := sqlitestore.Open(ctx, cfg.DataDir)
		if err != nil {
			return nil, nil, err
		}
		store, notifier, closers = s, s, append(closers, func() { _ = s.Close() })
	} else {
		pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
		if err != nil {
			return nil, nil, err
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, nil, err
		}
		closers = append(closers, pool.Close)
		if _, err := pgstore.Migrate(ctx, pool); err != nil {
			pool.Close()
			return nil, nil, err
		}
		listener := pgstore.NewListener(pool, pgstore.DefaultChannel, quiet)
		lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() { defer close(done); listener.Run(lctx) }()
		closers = append(closers, func() { cancel(); <-done })
		store, notifier = pgstore.New(pool), listener
	}
	srv := grpc.NewServer()
	// The service's one caller is the replay itself, which sends its
	// Begins as fast as the machine runs it: the default per-caller rate
	// (10,000 a second, bursts of 10,000) refuses a fast machine's Begins with
	// IDEMPOTENCY_QUOTA_EXCEEDED and changes the table, so the demo has
	// no rate limit, and no record quota either (runs on one PostgreSQL
	// database add up). Per-caller limits share a service among tool
	// servers; here there is nothing to share.
	opts := append(append([]dedupesvc.Option{}, cfg.serviceDefaults...), dedupesvc.WithNotifier(notifier), dedupesvc.WithLogger(quiet),
		dedupesvc.WithCallerRate(0, 0), dedupesvc.WithCallerQuota(0, 0))
	idemgatev1.RegisterDedupeServiceServer(srv, dedupesvc.NewServer(store, opts...))
	conn, stopSrv, err := serve(srv, grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
	if err != nil {
		return nil, nil, err
	}
	stop := func() {
		stopSrv()
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	return idemgatev1.NewDedupeServiceClient(conn), stop, nil
}

// gateFor builds a gate whose records live under their own tenant, so runs
// and scenarios never replay each other's outcomes. Its Dedupe calls get the
// call deadline, not the 5s default: on a starved machine a Begin can take
// that long, and a Begin given up on would change the replay's numbers.
func gateFor(dedupe idemgatev1.DedupeServiceClient, tenant string, cfg Config) func() (*interceptor.Gate, error) {
	return func() (*interceptor.Gate, error) {
		return interceptor.New(dedupe,
			interceptor.WithTenant(func(context.Context) (string, error) { return "incident-" + tenant, nil }),
			interceptor.WithDedupeTimeout(cfg.CallDeadline),
			interceptor.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	}
}

// Metadata the simulated runtime sends for the simulated network.
const (
	slowHeader    = "x-sim-slow"
	lostHeader    = "x-sim-lost"
	attemptHeader = "x-sim-attempt"
)

// network is the simulated network's memory of slow calls: for each attempt
// sent slow, whether the provider has acted on it, whether the client has
// given up on it, and whether the server is done with it.
type network struct {
	mu    sync.Mutex
	calls map[string]*slowCall
}

type slowCall struct {
	acted, gaveUp, served             chan struct{}
	actedOnce, gaveUpOnce, servedOnce sync.Once
}

func (n *network) call(id string) *slowCall {
	n.mu.Lock()
	defer n.mu.Unlock()
	c, ok := n.calls[id]
	if !ok {
		c = &slowCall{acted: make(chan struct{}), gaveUp: make(chan struct{}), served: make(chan struct{})}
		n.calls[id] = c
	}
	return c
}

// serve marks a slow call done at the server once everything on it has run,
// the gate's Finish included: the slow response would now be on its way.
func (n *network) serve(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if flag(ctx, slowHeader) {
		md, _ := metadata.FromIncomingContext(ctx)
		if ids := md.Get(attemptHeader); len(ids) == 1 {
			c := n.call(ids[0])
			defer c.servedOnce.Do(func() { close(c.served) })
		}
	}
	return handler(ctx, req)
}

// provider is the simulated payment provider's answer. A slow call's answer
// comes only once the client has given up on it: the provider tells the
// client it acted (the client's timeout then fires, in simulated time), and
// waits, on the handler's context as a real provider client does, until the
// client has gone.
func (n *network) provider(ctx context.Context) error {
	if !flag(ctx, slowHeader) {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	ids := md.Get(attemptHeader)
	if len(ids) != 1 {
		return status.Error(codes.Internal, "incident: a slow call without an attempt id")
	}
	c := n.call(ids[0])
	c.actedOnce.Do(func() { close(c.acted) })
	select {
	case <-c.gaveUp:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

func runScenario(ctx context.Context, cfg Config, plan []order, name string, newGate func() (*interceptor.Gate, error), kind keying) (Scenario, error) {
	ledger := &payments.Ledger{}
	nw := &network{calls: map[string]*slowCall{}}
	// Outside the gate: a response lost on the way back, after everything
	// ran. Inside the handler: a slow provider answer, after the side
	// effect ran.
	chain := []grpc.UnaryServerInterceptor{nw.serve, stall(cfg.stall), loseResponse}
	var serverOpts []grpc.ServerOption
	if newGate != nil {
		gate, err := newGate()
		if err != nil {
			return Scenario{}, err
		}
		chain = append(chain, gate.UnaryServerInterceptor())
		serverOpts = append(serverOpts, gate.ServerCodec())
	}
	srv := grpc.NewServer(append(serverOpts, grpc.ChainUnaryInterceptor(chain...))...)
	paymentsv1.RegisterPaymentsServiceServer(srv, &payments.Server{Ledger: ledger, Provider: nw.provider})
	conn, stop, err := serve(srv)
	if err != nil {
		return Scenario{}, err
	}
	defer stop()
	rt := &runtime{cfg: cfg, client: paymentsv1.NewPaymentsServiceClient(conn), net: nw, freshKeys: kind == freshModel,
		errors: map[string]int{}, unexpected: map[string]int{}}

	results := make([]orderResult, len(plan))
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range cfg.Concurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(plan) {
					return
				}
				results[i] = rt.order(ctx, i, plan[i])
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Scenario{}, err
	}

	s := Scenario{Name: name, Actions: 2 * len(plan), Calls: rt.calls.Load(), Replays: rt.replays.Load(), Errors: rt.errors, Unexpected: rt.unexpected}
	for i, o := range plan {
		charges, receipts := ledger.Executions(o.customer)
		s.Executed += charges + receipts
		s.Duplicates += max(0, charges-1) + max(0, receipts-1)
		for _, a := range []struct {
			what     string
			res      actionResult
			executed int64
		}{{"charge", results[i].charge, charges}, {"receipt", results[i].receipt, receipts}} {
			if !a.res.done {
				s.NotDone++
			}
			if why := kind.unexplained(a.res, a.executed); why != "" {
				s.Unexplained = append(s.Unexplained, fmt.Sprintf("order %d's %s %s", i, a.what, why))
			}
		}
	}
	return s, nil
}

// unexplained says what is wrong with an action that ran executed times, or
// "" if the row's promise holds for it.
func (k keying) unexplained(a actionResult, executed int64) string {
	switch {
	case !a.sent && executed != 0:
		return fmt.Sprintf("was never sent but ran %d times", executed)
	case a.done && executed == 0:
		return "succeeded but never ran"
	}
	limit := int64(-1) // no limit without the gate
	switch k {
	case orchestrated:
		limit = 1
	case freshModel:
		limit = 1
		if a.reemitted {
			limit = 2 // the model's own key is a second action to the gate
		}
	}
	if limit >= 0 && executed > limit {
		state := "succeeded"
		if !a.done {
			state = "was reported not done"
		}
		return fmt.Sprintf("%s but ran %d times, more than the %d its keys allow", state, executed, limit)
	}
	return ""
}

// actionResult is what the runtime saw of one action.
type actionResult struct {
	sent      bool // at least one attempt went out
	done      bool // an attempt succeeded
	reemitted bool // the model called again after it succeeded
}

// orderResult is what the runtime saw of one order.
type orderResult struct{ charge, receipt actionResult }

// runtime is the simulated agent runtime.
type runtime struct {
	cfg       Config
	client    paymentsv1.PaymentsServiceClient
	net       *network
	freshKeys bool

	calls, replays, attempts atomic.Int64
	mu                       sync.Mutex
	errors, unexpected       map[string]int
}

func (rt *runtime) order(ctx context.Context, i int, o order) orderResult {
	// The orchestration layer mints one key per logical action.
	chargeKey, receiptKey := fmt.Sprintf("order-%04d-charge", i), fmt.Sprintf("order-%04d-receipt", i)
	var (
		res    orderResult
		charge *paymentsv1.ChargeCardResponse
	)
	res.charge = rt.act(ctx, chargeKey, o.charge, fmt.Sprintf("model-%04d-charge-again", i), func(ctx context.Context, opts ...grpc.CallOption) error {
		resp, err := rt.client.ChargeCard(ctx, &paymentsv1.ChargeCardRequest{CustomerId: o.customer, AmountCents: o.amount}, opts...)
		if err == nil {
			charge = resp
		}
		return err
	})
	if !res.charge.done {
		return res // no receipt for a charge that was not done: the receipt is not done either
	}
	res.receipt = rt.act(ctx, receiptKey, o.notify, fmt.Sprintf("model-%04d-receipt-again", i), func(ctx context.Context, opts ...grpc.CallOption) error {
		_, err := rt.client.SendReceipt(ctx, &paymentsv1.SendReceiptRequest{CustomerId: o.customer, ChargeId: charge.GetChargeId()}, opts...)
		return err
	})
	return res
}

// act makes one logical action through the framework's retries, then lets
// the model re-emit it.
func (rt *runtime) act(ctx context.Context, key string, a action, modelKey string, call func(context.Context, ...grpc.CallOption) error) actionResult {
	res := actionResult{sent: true}
	var err error
	for j, at := range a.attempts {
		if j > 0 {
			// The framework's back-off, on the runtime's context.
			select {
			case <-time.After(20 * time.Millisecond):
			case <-ctx.Done():
				rt.fail(status.FromContextError(ctx.Err()).Err())
				return res
			}
		}
		if err = rt.send(ctx, key, at, call); err == nil {
			break
		}
	}
	if err != nil {
		rt.fail(err)
		return res
	}
	res.done = true
	if a.reemit {
		// The model calls again to be sure: with the orchestration's key, or
		// with one it made up.
		res.reemitted = true
		if rt.freshKeys {
			key = modelKey
		}
		if err := rt.send(ctx, key, attempt{}, call); err != nil {
			rt.fail(err)
		}
	}
	return res
}

// send makes one call attempt. A slow attempt times out in simulated time:
// the client gives up on it as soon as the provider has acted on it, lets the
// provider answer (to nobody), and returns once the server is done with the
// call, so that the framework's retry comes after the slow response, as it
// does when the client's timeout plus its back-off outlast the response. No
// wall-clock timer races the call, and no retry races the first call's
// Finish against the gate's max_wait.
func (rt *runtime) send(ctx context.Context, key string, at attempt, call func(context.Context, ...grpc.CallOption) error) error {
	rt.calls.Add(1)
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, rt.cfg.CallDeadline)
	defer cancel()
	id := strconv.FormatInt(rt.attempts.Add(1), 10)
	ctx = metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, key, attemptHeader, id,
		slowHeader, strconv.FormatBool(at.slow), lostHeader, strconv.FormatBool(at.lost))
	var timedOut atomic.Bool
	if at.slow {
		c := rt.net.call(id)
		defer c.gaveUpOnce.Do(func() { close(c.gaveUp) })
		go func() {
			select {
			case <-c.acted:
				timedOut.Store(true)
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	var header metadata.MD
	err := call(ctx, grpc.Header(&header))
	if timedOut.Load() {
		c := rt.net.call(id)
		c.gaveUpOnce.Do(func() { close(c.gaveUp) })
		wait, stop := context.WithTimeout(parent, rt.cfg.CallDeadline)
		select {
		case <-c.served:
		case <-wait.Done():
		}
		stop()
		return errSlow
	}
	if err == nil && interceptor.IsReplayed(header) {
		rt.replays.Add(1)
	}
	return err
}

func (rt *runtime) fail(err error) {
	reason := grpcerr.Reason(err)
	if reason == "" {
		reason = status.Code(err).String()
	}
	rt.mu.Lock()
	rt.errors[reason]++
	if !simulated(err) {
		rt.unexpected[reason]++
	}
	rt.mu.Unlock()
}

// The errors the simulation itself causes.
var (
	errSlow = status.Error(codes.DeadlineExceeded, "incident: the client timed out waiting for a slow response")
	errLost = status.Error(codes.Unavailable, "incident: the response was lost on the way back")
)

// simulated reports whether err is one the simulation caused, as the client
// receives it.
func simulated(err error) bool {
	got := status.Convert(err)
	for _, sim := range []error{errSlow, errLost} {
		if want := status.Convert(sim); got.Code() == want.Code() && got.Message() == want.Message() {
			return true
		}
	}
	return false
}

// loseResponse drops the response of a call marked lost, after the call ran.
func loseResponse(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err == nil && flag(ctx, lostHeader) {
		return nil, errLost
	}
	return resp, err
}

// stall delays every call by d before it runs, as a starved scheduler does;
// the wait ends early with the call's context.
func stall(d time.Duration) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
		return handler(ctx, req)
	}
}

func flag(ctx context.Context, name string) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(name)
	return len(v) == 1 && v[0] == "true"
}

func serve(srv *grpc.Server, dial ...grpc.DialOption) (*grpc.ClientConn, func(), error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)...)
	if err != nil {
		srv.Stop()
		return nil, nil, err
	}
	return conn, func() { _ = conn.Close(); srv.Stop() }, nil
}

// Table renders the report as the table the demo prints.
func (r Report) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d orders (ChargeCard + SendReceipt each), seed %d: slow responses %.0f%% (the client times out), lost responses %.0f%%, model re-emits %.0f%%, %d framework retries\n\n",
		r.Config.Orders, r.Config.Seed, 100*r.Config.SlowRate, 100*r.Config.LostRate, 100*r.Config.ReemitRate, r.Config.FrameworkRetries)
	fmt.Fprintf(&b, "%-44s %8s %6s %13s %11s %8s %9s  %s\n", "scenario", "actions", "calls", "side effects", "duplicates", "replays", "not done", "errors by reason")
	for _, s := range []Scenario{r.Ungated, r.Gated, r.FreshKey} {
		fmt.Fprintf(&b, "%-44s %8d %6d %13d %11d %8d %9d  %s\n", s.Name, s.Actions, s.Calls, s.Executed, s.Duplicates, s.Replays, s.NotDone, errorsText(s.Errors))
	}
	return b.String()
}

func errorsText(errs map[string]int) string {
	if len(errs) == 0 {
		return "none"
	}
	var parts []string
	for reason, n := range errs {
		parts = append(parts, fmt.Sprintf("%s=%d", reason, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

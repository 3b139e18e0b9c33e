package gatetest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/netfault"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// env is one case's world: a Dedupe service on its own schema, the ledger
// behind the handler, and the gates started on them.
type env struct {
	t       *testing.T
	newGate NewGate
	ledger  *ledger
	store   *pgstore.Store
	addr    string
	// dedupe is a client of the Dedupe service that bypasses every proxy,
	// for the suite's own Resolve.
	dedupe idemgatev1.DedupeServiceClient
	hooks  *hooks
}

// setup starts a case's Dedupe service; gates come from env.gate.
func setup(t *testing.T, newGate NewGate) *env {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	e := &env{t: t, newGate: newGate, ledger: newLedger(), hooks: newHooks()}
	e.store = pgstore.New(pool, pgstore.WithChannel(schema), pgstore.WithoutNotify())
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(e.hooks.intercept))
	idemgatev1.RegisterDedupeServiceServer(srv, dedupesvc.NewServer(e.store,
		dedupesvc.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		dedupesvc.WithPollInterval(50*time.Millisecond)))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	e.addr = lis.Addr().String()
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial the Dedupe service: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	e.dedupe = idemgatev1.NewDedupeServiceClient(conn)
	return e
}

// gate starts a gate of the adapter through a fresh proxy to the Dedupe
// service and returns its client and the proxy.
func (e *env) gate(replayCache bool) (Client, *netfault.Proxy) {
	e.t.Helper()
	p := netfault.NewProxy(e.t, e.addr)
	c := e.newGate(e.t, Config{Handler: e.ledger.handle, DedupeAddr: p.Addr(), ReplayCache: replayCache})
	return c, p
}

// resolveRelease settles key's outcome-unknown record as not run, as an
// operator would with idemctl resolve, and returns whether it found one.
func (e *env) resolveRelease(key string) bool {
	e.t.Helper()
	recs, err := e.store.ListRecords(context.Background(), dedupesvc.ListQuery{State: dedupesvc.StateUnknown, Limit: 100})
	if err != nil {
		e.t.Fatalf("list outcome-unknown records: %v", err)
	}
	for _, r := range recs {
		if r.ID.Key != key {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := e.dedupe.Resolve(ctx, &idemgatev1.ResolveRequest{Scope: r.ID.Scope, Key: key,
			Resolution: &idemgatev1.ResolveRequest_Release_{Release: &idemgatev1.ResolveRequest_Release{}}}); err != nil {
			e.t.Fatalf("resolve %s %q: %v", r.ID.Scope, key, err)
		}
		return true
	}
	return false
}

// hooks sit in the Dedupe service: they count its RPCs per method and key
// and can hold a key's Finish until released.
type hooks struct {
	mu     sync.Mutex
	calls  map[string]int // "Begin key" -> count
	finish map[string]*hold
}

// hold is a Finish held back for one key.
type hold struct {
	reached chan struct{} // closed when the first Finish arrived
	once    sync.Once
	release chan struct{} // closed to let them through
	// ended is set when the first held Finish's context ended before it was
	// let through: its sender gave up on it.
	mu       sync.Mutex
	attempts int
	ended    bool
}

func newHooks() *hooks {
	return &hooks{calls: map[string]int{}, finish: map[string]*hold{}}
}

func (h *hooks) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
	key := ""
	if k, ok := req.(interface{ GetKey() string }); ok {
		key = k.GetKey()
	}
	h.mu.Lock()
	h.calls[method+" "+key]++
	held := h.finish[key]
	h.mu.Unlock()
	if method == "Finish" && held != nil {
		held.mu.Lock()
		held.attempts++
		first := held.attempts == 1
		held.mu.Unlock()
		held.once.Do(func() { close(held.reached) })
		select {
		case <-held.release:
		case <-ctx.Done():
			if first {
				held.mu.Lock()
				held.ended = true
				held.mu.Unlock()
			}
			return nil, ctx.Err()
		}
	}
	return handler(ctx, req)
}

// count is how many RPCs of method (Begin, Finish, ...) named key.
func (h *hooks) count(method, key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[method+" "+key]
}

// holdFinish holds every Finish of key until the returned hold is released.
func (h *hooks) holdFinish(key string) *hold {
	hd := &hold{reached: make(chan struct{}), release: make(chan struct{})}
	h.mu.Lock()
	h.finish[key] = hd
	h.mu.Unlock()
	return hd
}

// letThrough releases the hold and reports whether its first Finish was
// still waiting, and how many Finish attempts it saw.
func (hd *hold) letThrough() (pending bool, attempts int) {
	hd.mu.Lock()
	pending, attempts = !hd.ended && hd.attempts > 0, hd.attempts
	hd.mu.Unlock()
	close(hd.release)
	return pending, attempts
}

// ledger is the suite's handler and its record: executions per label, a
// signal per execution start, and a release per label for BEHAVIOUR_BLOCK.
type ledger struct {
	mu      sync.Mutex
	entries map[string]*entry
}

type entry struct {
	runs    int
	started chan int // receives the execution number as each run starts
	release chan struct{}
	once    sync.Once
	ended   chan error // receives each run's context error as it returns
}

func newLedger() *ledger { return &ledger{entries: map[string]*entry{}} }

func (l *ledger) entry(label string) *entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.entries[label]
	if !ok {
		e = &entry{started: make(chan int, 64), release: make(chan struct{}), ended: make(chan error, 64)}
		l.entries[label] = e
	}
	return e
}

// runs is how many times the handler ran label.
func (l *ledger) runs(label string) int {
	e := l.entry(label)
	l.mu.Lock()
	defer l.mu.Unlock()
	return e.runs
}

// release lets label's blocked executions, present and future, succeed.
func (l *ledger) release(label string) {
	e := l.entry(label)
	e.once.Do(func() { close(e.release) })
}

// handle is the Handler: it counts the execution, then does what the
// request's behaviour says, honouring ctx like a production handler that
// passes it to its provider.
func (l *ledger) handle(ctx context.Context, method string, req *testingv1.ConformanceRequest) (*testingv1.ConformanceResponse, error) {
	e := l.entry(req.GetLabel())
	l.mu.Lock()
	e.runs++
	n := e.runs
	l.mu.Unlock()
	e.started <- n
	defer func() { e.ended <- ctx.Err() }()
	msg := fmt.Sprintf("%s: execution %d of %q failed on request", method, n, req.GetLabel())
	if _, ok := idemgate.FencingTokenFromContext(ctx); !ok {
		// Every gate's handler runs on the attempt's context, which carries
		// the call: a downstream write needs its fencing token.
		return nil, &Failure{Kind: Retryable, Code: codes.Internal, Message: msg + ": the handler's context does not carry the gated call (FencingTokenFromContext)"}
	}
	switch req.GetBehaviour() {
	case testingv1.Behaviour_BEHAVIOUR_BLOCK:
		select {
		case <-e.release:
		case <-ctx.Done():
			return nil, fmt.Errorf("provider: %w", context.Cause(ctx))
		}
	case testingv1.Behaviour_BEHAVIOUR_FAIL_RETRYABLE:
		return nil, &Failure{Kind: Retryable, Code: codes.Unavailable, Message: msg}
	case testingv1.Behaviour_BEHAVIOUR_FAIL_FINAL:
		return nil, &Failure{Kind: Unmarked, Code: codes.FailedPrecondition, Message: msg}
	case testingv1.Behaviour_BEHAVIOUR_FAIL_MARKED_FINAL:
		return nil, &Failure{Kind: Final, Code: codes.Aborted, Message: msg}
	case testingv1.Behaviour_BEHAVIOUR_FAIL_UNKNOWN:
		return nil, &Failure{Kind: OutcomeUnknown, Code: codes.Unavailable, Message: msg}
	case testingv1.Behaviour_BEHAVIOUR_WAIT_CONTEXT:
		<-ctx.Done()
		return nil, fmt.Errorf("provider: %w", ctx.Err())
	}
	return &testingv1.ConformanceResponse{Label: req.GetLabel(), Amount: req.GetAmount(),
		ChargeId: fmt.Sprintf("ch_%s_%d", req.GetLabel(), n), Execution: int64(n)}, nil
}

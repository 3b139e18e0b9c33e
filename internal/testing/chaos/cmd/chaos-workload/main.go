// Command chaos-workload drives the chaos tool the way agents' runtimes do:
// N logical actions with one idempotency key each, every action sent by
// several concurrent callers, each retried by the three layers that retry in
// real life, and every try recorded to a history file (JSON lines).
//
//	chaos-workload -targets ADDR[,ADDR] -history FILE -seed N [-actions 30] [-callers 3]
//	               [-late-metadata 0.5 -ledgers FILE[,FILE]] [-transport grpc|http|connect]
//	               [-ambiguous-fail-closed N] [-duplicates-after D]
//
// The layers, outermost first: an application loop with its own deadline per
// action, retrying UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED and
// RESOURCE_EXHAUSTED with backoff; go-grpc-middleware's retry interceptor
// (UNAVAILABLE and ABORTED, with a per-try timeout); and grpc-go's
// service-config retryPolicy on UNAVAILABLE. The caller interceptor that
// attaches keys is chained before the retry interceptor, so every retry
// reuses the action's key. Which actions are REEXECUTE, stall at the tool's
// pause point ("-p" in the key) or fail ambiguously ("-a") follows from the
// seed alone (-ambiguous-fail-closed tops up the FAIL_CLOSED ambiguous
// ones the draw gave, drawing nothing). So does which set their response metadata only after their
// caller gave up (chaos.LateMetadataSuffix): every caller of such an action
// gives up on its first try as soon as the side effect is in one of the
// tool servers' -ledgers, and the history keeps each answer's x-chaos-
// header and trailer.
//
// With -duplicates-after D, an action's first caller (to target i mod n for
// action i) starts alone, and the others (caller k to target i+k mod n)
// start D later: duplicates that arrive after the first caller's holder
// was cut off past its lease.
//
// With -transport http the targets are chaos-tool -http-listen addresses,
// and every caller goes through net/http instead (http.go): the same
// application loop, over a transport-level retry of the kind HTTP client
// libraries do, over net/http's own retry of a replayable request. With
// -transport connect they are chaos-tool -connect-listen addresses, called
// with connect-go's generated client (the Connect protocol) (connect.go):
// the same application loop over a retry layer like the gRPC one.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"log"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/chaos"
)

// toolServiceConfig is grpc-go's own retry layer: UNAVAILABLE is retried
// below every interceptor, with the same metadata and so the same key.
const toolServiceConfig = `{
  "methodConfig": [{
    "name": [{"service": "idemgate.testing.v1.ChaosService"}],
    "retryPolicy": {
      "maxAttempts": 3,
      "initialBackoff": "0.1s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

type config struct {
	targets     []string
	history     string
	seed        uint64
	actions     int
	callers     int
	spread      time.Duration
	concurrency int
	reexecute   float64
	pause       float64
	ambiguous   float64
	// ambiguousFailClosed is the least number of FAIL_CLOSED actions that
	// fail ambiguously (plan).
	ambiguousFailClosed int
	actionDeadline      time.Duration
	tryTimeout          time.Duration
	lateMetadata        float64
	ledgers             []string
	transport           string
	// duplicatesAfter delays every caller of an action but the first.
	duplicatesAfter time.Duration
	// firstTarget, when 0 or more, sends every action's first caller to
	// that target (caller k to firstTarget+k); -1 sends caller k of action
	// i to target i+k (mod the targets).
	firstTarget int
}

func main() {
	var c config
	targets := flag.String("targets", "", "comma-separated tool server `addresses`; callers are spread over them")
	flag.StringVar(&c.history, "history", "", "history `file` to write (required)")
	flag.Uint64Var(&c.seed, "seed", 1, "seed of every choice the workload makes")
	flag.IntVar(&c.actions, "actions", 30, "number of logical actions")
	flag.IntVar(&c.callers, "callers", 3, "concurrent callers per action")
	flag.DurationVar(&c.spread, "spread", 20*time.Second, "the actions' starts are spread evenly over this long")
	flag.IntVar(&c.concurrency, "concurrency", 24, "most actions in progress at once")
	flag.Float64Var(&c.reexecute, "reexecute", 0.3, "fraction of actions sent to ChargeReexecute instead of Charge")
	flag.Float64Var(&c.pause, "pause", 0.15, `fraction of actions whose key ends in "-p": the tool stalls them at its pause point`)
	flag.Float64Var(&c.ambiguous, "ambiguous", 0, `fraction of actions whose key ends in "-a": the tool fails them ambiguously once`)
	flag.IntVar(&c.ambiguousFailClosed, "ambiguous-fail-closed", 0, `at least this many FAIL_CLOSED actions fail ambiguously: when -ambiguous drew fewer, more non-pausing Charge actions get "-a", so a gate that releases keys after an ambiguous failure runs one twice in every seed`)
	flag.DurationVar(&c.actionDeadline, "action-deadline", 90*time.Second, "each caller's deadline for its action, across all its retries")
	flag.DurationVar(&c.tryTimeout, "try-timeout", 10*time.Second, "the retry interceptor's timeout per try")
	flag.Float64Var(&c.lateMetadata, "late-metadata", 0, `fraction of actions whose key ends in "-m": their callers give up on the first try once the side effect is in a ledger, before the handler sets its metadata`)
	ledgers := flag.String("ledgers", "", "comma-separated ledger `files` of the tool servers, watched for -late-metadata actions' side effects")
	flag.DurationVar(&c.duplicatesAfter, "duplicates-after", 0, "every caller of an action but the first (which goes to target i mod n for action i) starts this long after the action")
	flag.IntVar(&c.firstTarget, "first-target", -1, "send every action's first caller to this target (index into -targets) and caller k to the one k after it; -1: caller k of action i goes to target i+k")
	flag.StringVar(&c.transport, "transport", chaos.TransportGRPC, "how callers reach the targets: grpc, http (chaos-tool -http-listen addresses) or connect (-connect-listen addresses)")
	flag.Parse()
	if c.transport != chaos.TransportGRPC && c.transport != chaos.TransportHTTP && c.transport != chaos.TransportConnect {
		log.Fatalf("chaos-workload: -transport %q: want grpc, http or connect", c.transport)
	}
	if *ledgers != "" {
		c.ledgers = strings.Split(*ledgers, ",")
	}
	if *targets == "" || c.history == "" {
		log.Fatal("chaos-workload: -targets and -history are required")
	}
	c.targets = strings.Split(*targets, ",")
	if c.firstTarget >= len(c.targets) {
		log.Fatalf("chaos-workload: -first-target %d, but -targets names %d (the first is 0)", c.firstTarget, len(c.targets))
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.spread+c.actionDeadline+time.Minute)
	defer cancel()
	if err := run(ctx, c); err != nil {
		log.Fatalf("chaos-workload: %v", err)
	}
}

// action is one logical action.
type action struct {
	name, key, method string
}

func plan(c config) []action {
	rng := rand.New(rand.NewPCG(c.seed, 0x1de76a7e))
	actions := make([]action, c.actions)
	for i := range actions {
		a := action{name: fmt.Sprintf("a%05d", i), method: testingv1.ChaosService_Charge_FullMethodName}
		a.key = a.name
		if rng.Float64() < c.reexecute {
			a.method = testingv1.ChaosService_ChargeReexecute_FullMethodName
		}
		if rng.Float64() < c.pause {
			a.key += "-p"
		}
		if rng.Float64() < c.ambiguous {
			a.key += "-a"
		}
		// Drawn only when asked for, so other runs' plans stay as they were.
		if c.lateMetadata > 0 && rng.Float64() < c.lateMetadata {
			a.key += chaos.LateMetadataSuffix
		}
		actions[i] = a
	}
	ensureAmbiguousFailClosed(actions, c.ambiguousFailClosed)
	return actions
}

// ambiguousFailClosedKey reports whether a is a FAIL_CLOSED action that
// fails ambiguously.
func ambiguousFailClosedKey(a action) bool {
	return a.method == testingv1.ChaosService_Charge_FullMethodName && strings.Contains(a.key, "-a")
}

// ensureAmbiguousFailClosed makes FAIL_CLOSED actions ambiguous until at
// least n are: the k-th missing one the first eligible from k/(missing+1)
// of the way through (wrapping), so they spread over the run; non-pausing
// ones first, as a pausing one's ambiguous first run does not pause. It
// draws nothing: the plan's other choices stay as the seed made them.
func ensureAmbiguousFailClosed(actions []action, n int) {
	have := 0
	for _, a := range actions {
		if ambiguousFailClosedKey(a) {
			have++
		}
	}
	missing := n - have
	eligible := func(a action, pausing bool) bool {
		return a.method == testingv1.ChaosService_Charge_FullMethodName && !strings.Contains(a.key, "-a") &&
			!strings.HasSuffix(a.key, chaos.LateMetadataSuffix) && (pausing || !strings.Contains(a.key, "-p"))
	}
	for k := 1; k <= missing; k++ {
		from := k * len(actions) / (missing + 1)
	find:
		for _, pausing := range []bool{false, true} {
			for j := range actions {
				a := &actions[(from+j)%len(actions)]
				if eligible(*a, pausing) {
					a.key += "-a"
					break find
				}
			}
		}
	}
}

func run(ctx context.Context, c config) error {
	f, err := os.Create(c.history)
	if err != nil {
		return err
	}
	w := &historyWriter{w: bufio.NewWriter(f)}
	caller, err := interceptor.NewCaller()
	if err != nil {
		return err
	}
	conns := make([]*grpc.ClientConn, len(c.targets))
	var httpClients []*httpCaller
	if c.transport == chaos.TransportHTTP {
		httpClients = make([]*httpCaller, len(c.targets))
		for i, target := range c.targets {
			httpClients[i] = newHTTPCaller(target, c.tryTimeout, w)
			defer httpClients[i].close()
		}
	}
	var connectClients []*connectCaller
	if c.transport == chaos.TransportConnect {
		connectClients = make([]*connectCaller, len(c.targets))
		for i, target := range c.targets {
			connectClients[i] = newConnectCaller(target, c.tryTimeout, w)
			defer connectClients[i].close()
		}
	}
	for i, target := range c.targets {
		if c.transport != chaos.TransportGRPC {
			break
		}
		conns[i], err = grpc.NewClient(target,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultServiceConfig(toolServiceConfig),
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second}, MinConnectTimeout: 5 * time.Second}),
			grpc.WithChainUnaryInterceptor(
				caller.UnaryClientInterceptor(), // first: one key per action, reused by every retry below
				retry.UnaryClientInterceptor(
					retry.WithMax(3),
					retry.WithCodes(codes.Unavailable, codes.Aborted),
					retry.WithPerRetryTimeout(c.tryTimeout),
					retry.WithBackoff(retry.BackoffExponentialWithJitterBounded(200*time.Millisecond, 0.2, 2*time.Second)),
				),
				w.record(target), // last: sees every try of the retry interceptor
			))
		if err != nil {
			return err
		}
		defer conns[i].Close()
	}

	var effects *ledgerWatch
	if c.lateMetadata > 0 {
		if len(c.ledgers) == 0 {
			return errors.New("-late-metadata needs -ledgers")
		}
		if c.transport != chaos.TransportGRPC {
			return errors.New("-late-metadata needs -transport grpc: its handlers set gRPC metadata")
		}
		effects = watchLedgers(ctx, c.ledgers)
	}
	actions := plan(c)
	sem := make(chan struct{}, c.concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for i, a := range actions {
		at := start.Add(c.spread * time.Duration(i) / time.Duration(max(1, len(actions))))
		if d := time.Until(at); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		var callers sync.WaitGroup
		for k := range c.callers {
			wg.Add(1)
			callers.Add(1)
			go func() {
				defer wg.Done()
				defer callers.Done()
				if k > 0 && c.duplicatesAfter > 0 {
					select {
					case <-time.After(c.duplicatesAfter):
					case <-ctx.Done():
						return
					}
				}
				target := (i + k) % len(c.targets)
				if c.firstTarget >= 0 {
					target = (c.firstTarget + k) % len(c.targets)
				}
				switch {
				case httpClients != nil:
					httpClients[target].callAction(ctx, c, a, k)
					return
				case connectClients != nil:
					connectClients[target].callAction(ctx, c, a, k)
					return
				}
				client := testingv1.NewChaosServiceClient(conns[target])
				callAction(ctx, c, client, a, k, effects)
			}()
		}
		go func() { callers.Wait(); <-sem }()
	}
	wg.Wait()
	if err := w.close(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Printf("chaos-workload: %d actions, %d callers each, %d tries recorded in %s\n", len(actions), c.callers, w.n.Load(), time.Since(start).Round(time.Millisecond))
	return nil
}

// callAction is one caller's application loop for one action, over gRPC.
func callAction(ctx context.Context, c config, client testingv1.ChaosServiceClient, a action, callerID int, effects *ledgerWatch) {
	req := &testingv1.ChargeRequest{Action: a.name, AmountCents: 4200}
	applicationLoop(ctx, c, a, callerID, func(ctx context.Context, attempt int) (codes.Code, time.Duration) {
		ctx = interceptor.WithKey(ctx, a.key)
		info := &tryInfo{action: a.name, key: a.key, caller: callerID, attempt: attempt}
		actx := context.WithValue(ctx, tryInfoKey{}, info)
		giveUp := func() {}
		if attempt == 1 && effects != nil && strings.HasSuffix(a.key, chaos.LateMetadataSuffix) {
			actx, giveUp = effects.giveUpOnEffect(actx, a.key)
		}
		var err error
		if a.method == testingv1.ChaosService_ChargeReexecute_FullMethodName {
			_, err = client.ChargeReexecute(actx, req)
		} else {
			_, err = client.Charge(actx, req)
		}
		giveUp()
		d, _ := grpcerr.RetryDelay(err)
		return status.Code(err), d
	})
}

// applicationLoop is one caller's application loop for one action, whatever
// the transport: call (the attempt, numbered from 1) until it answers
// something other than UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED,
// RESOURCE_EXHAUSTED or CANCELLED, backing off between attempts (at least
// the answer's retry delay), within the action's deadline.
func applicationLoop(ctx context.Context, c config, a action, callerID int, call func(ctx context.Context, attempt int) (codes.Code, time.Duration)) {
	ctx, cancel := context.WithTimeout(ctx, c.actionDeadline)
	defer cancel()
	// Each caller backs off on its own jittered schedule, from its own seed.
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", a.key, callerID)
	rng := rand.New(rand.NewPCG(c.seed, h.Sum64()))
	for attempt := 1; ; attempt++ {
		code, retryDelay := call(ctx, attempt)
		switch code {
		case codes.Unavailable, codes.Aborted, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Canceled:
		default:
			return // OK, or an answer retrying will not change
		}
		delay := 200*time.Millisecond + time.Duration(rng.Int64N(int64(400*time.Millisecond)))
		if retryDelay > delay {
			delay = retryDelay
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

type tryInfoKey struct{}

// tryInfo is what the recording interceptor needs about the application's
// call; tries counts the retry interceptor's tries of it.
type tryInfo struct {
	action, key     string
	caller, attempt int
	tries           atomic.Int64
}

// historyWriter writes Attempts as JSON lines.
type historyWriter struct {
	mu  sync.Mutex
	w   *bufio.Writer
	err error
	n   atomic.Int64
}

func (h *historyWriter) write(a chaos.Attempt) {
	b, err := json.Marshal(a)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.err = errors.Join(h.err, err)
		return
	}
	if _, err := h.w.Write(append(b, '\n')); err != nil {
		h.err = errors.Join(h.err, err)
	}
	h.n.Add(1)
}

func (h *historyWriter) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return errors.Join(h.err, h.w.Flush())
}

// record returns the innermost interceptor: it records each try with the
// response exactly as it came off the wire and the replayed header.
func (h *historyWriter) record(target string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		info, _ := ctx.Value(tryInfoKey{}).(*tryInfo)
		if info == nil {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		var header, trailer metadata.MD
		codec := &capturingCodec{CodecV2: encoding.GetCodecV2("proto")}
		a := chaos.Attempt{Action: info.action, Key: info.key, Method: method, Caller: info.caller, Attempt: info.attempt,
			Try: int(info.tries.Add(1)), Target: target, Start: time.Now()}
		err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&header), grpc.Trailer(&trailer), grpc.ForceCodecV2(codec))...)
		a.End = time.Now()
		a.Code = status.Code(err).String()
		a.Reason = grpcerr.Reason(err)
		if err == nil {
			a.Response = codec.received
			a.Replayed = interceptor.IsReplayed(header)
			a.Header, a.Trailer = chaosMetadata(header), chaosMetadata(trailer)
		}
		h.write(a)
		return err
	}
}

// capturingCodec is the proto codec, keeping the last message it decoded as
// the bytes that arrived.
type capturingCodec struct {
	encoding.CodecV2
	received []byte
}

func (c *capturingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c.received = data.Materialize()
	return c.CodecV2.Unmarshal(data, v)
}

// chaosMetadata is the part of md the chaos tool set (chaos.MetadataPrefix),
// as bytes, or nil.
func chaosMetadata(md metadata.MD) map[string][][]byte {
	var out map[string][][]byte
	for k, vs := range md {
		if !strings.HasPrefix(k, chaos.MetadataPrefix) {
			continue
		}
		if out == nil {
			out = map[string][][]byte{}
		}
		for _, v := range vs {
			out[k] = append(out[k], []byte(v))
		}
	}
	return out
}

// ledgerWatch follows the tool servers' ledgers and tells, per key, when a
// side effect of it is there.
type ledgerWatch struct {
	mu      sync.Mutex
	effects map[string]chan struct{}
}

// effect returns a channel closed once a side effect of key is in a ledger.
func (w *ledgerWatch) effect(key string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.chanLocked(key)
}

func (w *ledgerWatch) chanLocked(key string) chan struct{} {
	ch, ok := w.effects[key]
	if !ok {
		ch = make(chan struct{})
		w.effects[key] = ch
	}
	return ch
}

func (w *ledgerWatch) saw(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := w.chanLocked(key)
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// giveUpOnEffect returns ctx cancelled once a side effect of key is in a
// ledger, as a caller that gives up on a call once it started (its own
// timeout, a user who closed the page), and the function that ends the
// watch when the try returned.
func (w *ledgerWatch) giveUpOnEffect(ctx context.Context, key string) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	returned := make(chan struct{})
	go func() {
		select {
		case <-w.effect(key):
			cancel()
		case <-returned:
		}
	}()
	return ctx, func() { close(returned); cancel() }
}

// watchLedgers polls paths for new effect lines until ctx ends.
func watchLedgers(ctx context.Context, paths []string) *ledgerWatch {
	w := &ledgerWatch{effects: map[string]chan struct{}{}}
	offsets := make([]int64, len(paths))
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			for i, p := range paths {
				offsets[i] = w.scan(p, offsets[i])
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// scan reads the complete lines of path from off and returns the offset
// after them.
func (w *ledgerWatch) scan(path string, off int64) int64 {
	f, err := os.Open(path)
	if err != nil {
		return off // not written yet
	}
	defer f.Close()
	if _, err := f.Seek(off, 0); err != nil {
		return off
	}
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return off // a partial line is read again next time
		}
		off += int64(len(line))
		var e chaos.LedgerEntry
		if json.Unmarshal(line, &e) == nil && e.Event == chaos.EventEffect {
			w.saw(e.Key)
		}
	}
}

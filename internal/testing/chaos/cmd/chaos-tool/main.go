// Command chaos-tool is the tool server the chaos suite breaks: it serves
// idemgate.testing.v1.ChaosService gated by the idemgate interceptor, and
// records every execution in a crash-safe ledger (one fsynced JSON line per
// event, the side effect's before the handler returns).
//
//	chaos-tool -listen ADDR -dedupe ADDR -ledger FILE [-name NAME]
//	           [-latency 20ms] [-pause-keys RE -pause-for 3s] [-ambiguous-keys RE]
//	           [-late-metadata-keys RE -late-metadata-wait 15s]
//	           [-default-backoff] [-http-listen ADDR] [-connect-listen ADDR]
//	           [-drop-first-finish DIR -drop-first-finish-after 200ms]
//
// A key matching -pause-keys makes the handler stall for -pause-for between
// its side effect and its return, where the suite kills or stops the process.
// A key matching -ambiguous-keys makes the first run of it in this process
// fail with DEADLINE_EXCEEDED after the side effect, as a provider call that
// timed out after charging would. A key matching -late-metadata-keys makes
// the handler, after its side effect, wait until its caller has given up (at
// most -late-metadata-wait), then set a response header and trailer
// (chaos.ChargeIDHeader, chaos.ResponseTrailer) and return: metadata set
// after the caller left, which every replay must still carry.
//
// With -drop-first-finish DIR, the first Finish of each key among the tool
// servers sharing DIR is dropped: never sent, so the store never sees it,
// and failed UNAVAILABLE no sooner than -drop-first-finish-after past this
// process's Begin of the key. The tool server publishes a chaos.DropClaim
// file in DIR and waits (at most 5s) for the suite's acknowledgement before
// it fails the Finish, so the suite cuts it off from the Dedupe service
// before the gate can retry: a holder whose first Finish fails, then is cut
// off past its lease.
//
// It reconnects to a restarted Dedupe service within a second; with
// -default-backoff it dials as docs/gating.md shows instead: grpc-go's default
// reconnect backoff, which grows to two minutes, and WithDedupeConn.
//
// With -http-listen it also serves the same handler logic (the same server:
// one ledger, one counter of charge ids, the same pause, ambiguous and
// latency behaviour) over HTTP, gated by httpgate with the proto policies of
// the two methods: POST /charge (Charge, FAIL_CLOSED) and POST
// /charge-reexecute (ChargeReexecute, REEXECUTE), each with a 6s lease and a
// 2s max_wait. The request body is a ChargeRequest, binary protobuf or
// protojson (Content-Type application/json); a 200's body is the binary
// ChargeResponse (application/x-protobuf), exactly the bytes the ledger
// records as the side effect's response. The ambiguous failure is a 504
// problem marked httpgate.MarkOutcomeUnknown; a provider call cut short by
// the handler's context is a 504 that httpgate's context rule marks
// unknown. The HTTP handler reads its key from the Idempotency-Key header;
// httpgate hands a handler no fencing token nor downstream key, so its
// responses and ledger lines carry epoch 0 and no downstream key.
//
// With -connect-listen it also serves the same handler logic through the
// generated Connect handler gated by connectgate (Connect, gRPC and gRPC-Web
// over HTTP/1.1 and h2c), whose policies are read from chaos.proto as the
// interceptor reads them; its handler reads the key, the fencing token and
// the downstream key from the context as the gRPC handler does. It serves with
// connect-go's default codecs, as a production server does.
//
// IDEMGATE_CHAOS_BROKEN_GATE=1 chains a deliberately broken layer inside the
// gate that marks every handler error retryable, context errors included, so
// the gate releases the key after an ambiguous failure and a retry runs the
// side effect again; the HTTP handler then marks every failure it answers
// httpgate.MarkRetryable, and a Connect interceptor inside connectgate marks
// every handler error retryable, to the same effect. It exists to prove the checker
// catches that.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/chaos"
)

// brokenGateEnv names the environment variable that turns the broken layer on.
const brokenGateEnv = "IDEMGATE_CHAOS_BROKEN_GATE"

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "gRPC listen `address`")
	dedupe := flag.String("dedupe", "127.0.0.1:50051", "`address` of the Dedupe service")
	ledgerPath := flag.String("ledger", "", "ledger `file` to append executions to (required)")
	name := flag.String("name", "tool", "server `name` in the ledger and in charge ids")
	latency := flag.Duration("latency", 20*time.Millisecond, "simulated provider latency, waited on the handler's context")
	pauseKeys := flag.String("pause-keys", "", "`regexp` of keys whose handler stalls between its side effect and its return")
	pauseFor := flag.Duration("pause-for", 3*time.Second, "how long a -pause-keys handler stalls")
	ambiguousKeys := flag.String("ambiguous-keys", "", "`regexp` of keys whose first run here fails with DEADLINE_EXCEEDED after its side effect")
	flag.StringVar(&late.keys, "late-metadata-keys", "", "`regexp` of keys whose handler sets its response metadata only after its caller gave up")
	flag.DurationVar(&late.wait, "late-metadata-wait", 15*time.Second, "how long a -late-metadata-keys handler waits for its caller to give up")
	defaultBackoff := flag.Bool("default-backoff", false, "dial the Dedupe service as docs/gating.md shows: grpc-go's default reconnect backoff, and WithDedupeConn")
	flag.StringVar(&httpListen, "http-listen", "", "also serve ChaosService over HTTP, gated by httpgate, on this `address`")
	flag.StringVar(&connectListen, "connect-listen", "", "also serve ChaosService over Connect (HTTP/1.1 and h2c), gated by connectgate, on this `address`")
	flag.StringVar(&dropFinish.dir, "drop-first-finish", "", "drop the first Finish of each key among the tool servers sharing this `directory` (never sent, failed UNAVAILABLE), once the suite acknowledged it")
	flag.DurationVar(&dropFinish.after, "drop-first-finish-after", 200*time.Millisecond, "a dropped Finish fails no sooner than this long after its key's Begin")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*listen, *dedupe, *ledgerPath, *name, *latency, *pauseKeys, *pauseFor, *ambiguousKeys, *defaultBackoff, logger); err != nil {
		logger.Error("chaos-tool failed", slog.Any("error", err))
		os.Exit(1)
	}
}

func run(listen, dedupeAddr, ledgerPath, name string, latency time.Duration, pauseKeys string, pauseFor time.Duration, ambiguousKeys string, defaultBackoff bool, logger *slog.Logger) error {
	if ledgerPath == "" {
		return errors.New("-ledger is required")
	}
	pause, err := compile(pauseKeys)
	if err != nil {
		return err
	}
	ambiguous, err := compile(ambiguousKeys)
	if err != nil {
		return err
	}
	lateKeys, err := compile(late.keys)
	if err != nil {
		return err
	}
	ledger, err := chaos.OpenLedger(ledgerPath)
	if err != nil {
		return err
	}
	defer ledger.Close()

	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig),
	}
	if !defaultBackoff {
		// Reconnect to a restarted Dedupe service within a second, not the
		// default backoff's two minutes.
		dial = append(dial, grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second}, MinConnectTimeout: 5 * time.Second}))
	}
	if dropFinish.dir != "" {
		dial = append(dial, grpc.WithChainUnaryInterceptor(newFinishDropper(dropFinish.dir, name, dropFinish.after, logger).intercept))
	}
	conn, err := grpc.NewClient(dedupeAddr, dial...)
	if err != nil {
		return fmt.Errorf("dedupe client: %w", err)
	}
	defer conn.Close()
	gateOpts := []interceptor.Option{interceptor.WithLogger(logger)}
	if defaultBackoff {
		// As docs/gating.md says: the Gate then cuts the backoff when a Dedupe RPC
		// fails, so its holders renew within a restart's grace.
		gateOpts = append(gateOpts, interceptor.WithDedupeConn(conn))
	}
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn), gateOpts...)
	if err != nil {
		return err
	}
	broken := os.Getenv(brokenGateEnv) == "1"
	chain := []grpc.UnaryServerInterceptor{recovery.UnaryServerInterceptor(), keepCallerDone, gate.UnaryServerInterceptor()}
	if broken {
		logger.Warn("the broken layer is on: every handler error (and every HTTP handler failure) is marked retryable, so ambiguous failures run again")
		chain = append(chain, breakGate)
	}
	srv := grpc.NewServer(gate.ServerCodec(), grpc.ChainUnaryInterceptor(chain...))
	chaosServer := &server{
		name: name, pid: os.Getpid(), ledger: ledger, latency: latency,
		pause: pause, pauseFor: pauseFor, ambiguous: ambiguous, failed: map[string]bool{}, logger: logger,
		lateKeys: lateKeys, lateWait: late.wait, broken: broken,
	}
	testingv1.RegisterChaosServiceServer(srv, chaosServer)
	if err := gate.CheckServer(srv); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); srv.GracefulStop() }()
	if httpListen != "" {
		httpGate, err := newHTTPGate(idemgatev1.NewDedupeServiceClient(conn), conn, defaultBackoff, logger)
		if err != nil {
			return err
		}
		defer func() {
			closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = httpGate.Close(closeCtx)
		}()
		hsrv, err := serveHTTP(httpListen, httpGate, chaosServer, logger)
		if err != nil {
			return err
		}
		defer func() {
			closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = hsrv.Shutdown(closeCtx)
		}()
	}
	if connectListen != "" {
		stopConnect, err := serveConnect(connectListen, idemgatev1.NewDedupeServiceClient(conn), conn, defaultBackoff, broken, chaosServer, logger)
		if err != nil {
			return err
		}
		defer stopConnect()
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(closeCtx)
	}()
	logger.Info("chaos tool serving", slog.String("address", lis.Addr().String()), slog.String("dedupe", dedupeAddr), slog.String("name", name),
		slog.String("Charge", gate.Policy(testingv1.ChaosService_Charge_FullMethodName).String()),
		slog.String("ChargeReexecute", gate.Policy(testingv1.ChaosService_ChargeReexecute_FullMethodName).String()))
	return srv.Serve(lis)
}

func compile(expr string) (*regexp.Regexp, error) {
	if expr == "" {
		return nil, nil
	}
	return regexp.Compile(expr)
}

// breakGate is the broken layer: between the gate and the handler, it marks
// every handler error retryable, so the gate releases the key even when the
// side effect may have happened.
func breakGate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err != nil {
		return resp, idemgate.RetryableError(err)
	}
	return resp, nil
}

// server is the ChaosService: a charge whose side effect is a ledger line.
type server struct {
	testingv1.UnimplementedChaosServiceServer
	name      string
	pid       int
	ledger    *chaos.Ledger
	latency   time.Duration
	pause     *regexp.Regexp
	pauseFor  time.Duration
	ambiguous *regexp.Regexp
	lateKeys  *regexp.Regexp
	lateWait  time.Duration
	logger    *slog.Logger
	count     atomic.Int64
	mu        sync.Mutex
	failed    map[string]bool // keys whose ambiguous failure this process has shown
	// broken: the HTTP handler marks every failure retryable (the broken
	// layer's HTTP counterpart).
	broken bool
}

func (s *server) Charge(ctx context.Context, req *testingv1.ChargeRequest) (*testingv1.ChargeResponse, error) {
	return s.charge(ctx, req, testingv1.ChaosService_Charge_FullMethodName)
}

func (s *server) ChargeReexecute(ctx context.Context, req *testingv1.ChargeRequest) (*testingv1.ChargeResponse, error) {
	return s.charge(ctx, req, testingv1.ChaosService_ChargeReexecute_FullMethodName)
}

func (s *server) charge(ctx context.Context, req *testingv1.ChargeRequest, method string) (*testingv1.ChargeResponse, error) {
	key, _ := idemgate.KeyFromContext(ctx)
	token, _ := idemgate.FencingTokenFromContext(ctx)
	downstream, _ := idemgate.DownstreamKeyFromContext(ctx)
	resp, _, err := s.execute(ctx, req, execution{key: key, method: method, epoch: token.Epoch, downstream: downstream, lateMetadata: true})
	switch {
	case errors.Is(err, errAmbiguous):
		return nil, status.Error(codes.DeadlineExceeded, "chaos-tool: the provider timed out after it charged")
	case errors.Is(err, errMarshal):
		return nil, status.Error(codes.Internal, err.Error())
	}
	return resp, err
}

// execution is what a handler knows of its call, whatever its transport.
type execution struct {
	key, method, downstream string
	epoch                   int64
	// lateMetadata: the transport sets gRPC response metadata, so a
	// -late-metadata-keys key sets it after its caller gave up.
	lateMetadata bool
}

// The failures execute reports besides the context's and late metadata's.
var (
	// errAmbiguous: the provider timed out after it charged (an
	// -ambiguous-keys key's first run here).
	errAmbiguous = errors.New("chaos-tool: the provider timed out after it charged")
	errMarshal   = errors.New("chaos-tool: marshal the response")
)

// execute is the charge, for every transport: the ledger's start line, the
// provider call, the side effect's line with the response's wire bytes
// (returned as body), then the ambiguous failure, the late metadata or the
// pause the key asks for, and the end line.
func (s *server) execute(ctx context.Context, req *testingv1.ChargeRequest, x execution) (resp *testingv1.ChargeResponse, body []byte, err error) {
	entry := chaos.LedgerEntry{Server: s.name, Pid: s.pid, Key: x.key, Action: req.GetAction(), Method: x.method, Epoch: x.epoch}
	s.record(entry, chaos.EventStart)

	// The provider call: it takes a while, and a handler gives up when its
	// context ends (fenced, or past execution_timeout), as a real one does.
	t := time.NewTimer(s.latency)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		entry.Error = ctx.Err().Error()
		s.record(entry, chaos.EventEnd)
		return nil, nil, ctx.Err()
	}
	resp = &testingv1.ChargeResponse{
		ChargeId:      fmt.Sprintf("%s-%d-%d", s.name, s.pid, s.count.Add(1)),
		Action:        req.GetAction(),
		Epoch:         x.epoch,
		DownstreamKey: x.downstream,
	}
	body, err = proto.Marshal(resp)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errMarshal, err)
	}
	effect := entry
	effect.Response = body
	s.record(effect, chaos.EventEffect)

	if s.ambiguous != nil && s.ambiguous.MatchString(x.key) && s.firstFailure(x.key) {
		entry.Error = "provider timed out after charging"
		s.record(entry, chaos.EventEnd)
		return nil, nil, errAmbiguous
	}
	if x.lateMetadata && s.lateKeys != nil && s.lateKeys.MatchString(x.key) {
		gone, err := s.setMetadataLate(ctx, x.key, resp.GetChargeId(), body)
		if err != nil {
			entry.Error = err.Error()
			s.record(entry, chaos.EventEnd)
			return nil, nil, err
		}
		entry.CallerGone = gone
	}
	if s.pause != nil && s.pause.MatchString(x.key) {
		// A stall where a crash hurts most: the side effect is done, the
		// outcome not yet stored.
		s.logger.Info("pausing between side effect and return", slog.String("key", x.key), slog.Duration("for", s.pauseFor))
		time.Sleep(s.pauseFor)
	}
	s.record(entry, chaos.EventEnd)
	return resp, body, nil
}

// dropFinish is the -drop-first-finish flags.
var dropFinish struct {
	dir   string
	after time.Duration
}

// late is the -late-metadata-* flags.
var late struct {
	keys string
	wait time.Duration
}

// callerDoneKey carries the caller's Done channel into the handler, whose
// own context the gate detaches from the caller's.
type callerDoneKey struct{}

// keepCallerDone runs before the gate: it keeps the caller's Done channel
// among the context's values, which the handler's context keeps.
func keepCallerDone(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return handler(context.WithValue(ctx, callerDoneKey{}, ctx.Done()), req)
}

// setMetadataLate waits until the caller has given up (at most lateWait, on
// the handler's context, as a handler waits on its provider), then sets the
// response header and trailer, and reports whether the caller was gone. A
// refusal is logged, not returned, as a handler that already charged does
// not fail the call over a header.
func (s *server) setMetadataLate(ctx context.Context, key, chargeID string, body []byte) (gone bool, err error) {
	done, _ := ctx.Value(callerDoneKey{}).(<-chan struct{})
	t := time.NewTimer(s.lateWait)
	defer t.Stop()
	select {
	case <-done:
		gone = true
	case <-t.C:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	if err := grpc.SetHeader(ctx, metadata.Pairs(chaos.ChargeIDHeader, chargeID)); err != nil {
		s.logger.Warn("the response header was refused", slog.String("key", key), slog.Bool("caller_gone", gone), slog.Any("error", err))
	}
	if err := grpc.SetTrailer(ctx, metadata.Pairs(chaos.ResponseTrailer, string(body))); err != nil {
		s.logger.Warn("the response trailer was refused", slog.String("key", key), slog.Bool("caller_gone", gone), slog.Any("error", err))
	}
	return gone, nil
}

func (s *server) firstFailure(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed[key] {
		return false
	}
	s.failed[key] = true
	return true
}

// record appends to the ledger with the current time. A ledger that cannot
// be written makes the run unverifiable, so the process stops at once.
func (s *server) record(e chaos.LedgerEntry, event string) {
	e.Event, e.Time = event, time.Now()
	if err := s.ledger.Append(e); err != nil {
		s.logger.Error("ledger append failed; exiting so the run is not trusted", slog.Any("error", err))
		os.Exit(3)
	}
}

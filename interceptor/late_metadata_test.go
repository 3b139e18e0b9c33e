package interceptor_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// lateMetadataServer's Mutate sets the response metadata the request asks
// for only once its caller has gone: the first execution of each key waits
// (on its context, as a production handler does) until the tool server has
// seen the caller cancel or time out, then sets header and trailer and
// returns, checking every error as a production handler would.
type lateMetadataServer struct {
	testingv1.UnimplementedTestServiceServer

	mu    sync.Mutex
	calls map[string]*lateCall
}

// lateCall is what happened to the first call of one key.
type lateCall struct {
	started, gone, served chan struct{}
	startOnce, goneOnce   sync.Once
	servedOnce            sync.Once
	executions            atomic.Int64
}

func (s *lateMetadataServer) call(ctx context.Context) *lateCall {
	md, _ := metadata.FromIncomingContext(ctx)
	return s.callFor(md.Get(idemgate.KeyHeader)[0])
}

func (s *lateMetadataServer) callFor(key string) *lateCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls == nil {
		s.calls = map[string]*lateCall{}
	}
	c, ok := s.calls[key]
	if !ok {
		c = &lateCall{started: make(chan struct{}), gone: make(chan struct{}), served: make(chan struct{})}
		s.calls[key] = c
	}
	return c
}

// watchCaller runs before the gate, on the caller's own context: it marks
// the caller gone when that context ends, and the call served once
// everything, the gate's Finish included, has run.
func (s *lateMetadataServer) watchCaller(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c := s.call(ctx)
	go func() {
		<-ctx.Done()
		c.goneOnce.Do(func() { close(c.gone) })
	}()
	resp, err := handler(ctx, req)
	c.servedOnce.Do(func() { close(c.served) })
	return resp, err
}

func (s *lateMetadataServer) Mutate(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	c := s.call(ctx)
	n := c.executions.Add(1)
	first := false
	c.startOnce.Do(func() { first = true; close(c.started) })
	if first {
		select {
		case <-c.gone:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	for _, p := range req.GetSetHeader() {
		if err := grpc.SetHeader(ctx, metadata.Pairs(p.GetKey(), string(p.GetValue()))); err != nil {
			return nil, err
		}
	}
	for _, p := range req.GetSetTrailer() {
		if err := grpc.SetTrailer(ctx, metadata.Pairs(p.GetKey(), string(p.GetValue()))); err != nil {
			return nil, err
		}
	}
	return &testingv1.MutateResponse{Payload: req.GetPayload(), Execution: n}, nil
}

// gaveUp is one action whose caller gave up after its handler started and
// before the handler set its response metadata.
type gaveUp struct {
	srv    *lateMetadataServer
	client testingv1.TestServiceClient
	codec  *recordingCodec
	logs   *logBuffer
	key    string
	req    *testingv1.MutateRequest
}

// giveUp runs an action on a fresh stack whose caller cancels (how:
// "cancel") or times out ("deadline") once its handler has started, and
// returns once the handler ran on and its outcome was stored.
func giveUp(t *testing.T, how string) gaveUp {
	t.Helper()
	g := gaveUp{srv: &lateMetadataServer{}, codec: &recordingCodec{}, logs: &logBuffer{},
		req: withMetadata(&testingv1.MutateRequest{Payload: "charge after the caller left"})}
	stack := stacktest.Start(t, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, g.srv) }, stacktest.Config{
		GateOptions:      []interceptor.Option{interceptor.WithLogger(g.logs.logger())},
		ToolInterceptors: []grpc.UnaryServerInterceptor{g.srv.watchCaller},
		ToolDial:         []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.ForceCodec(g.codec))},
	})
	g.client = testingv1.NewTestServiceClient(stack.Tool)
	// A deadline that ran out before the handler even started (a starved
	// machine) is tried again, longer, under another key.
	for deadline := 2 * time.Second; g.key == ""; deadline *= 2 {
		k := how + "-" + deadline.String()
		ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), idemgate.KeyHeader, k))
		if how == "deadline" {
			ctx, cancel = context.WithTimeout(ctx, deadline)
		}
		returned := make(chan error, 1)
		go func() {
			_, err := g.client.Mutate(ctx, g.req)
			returned <- err
		}()
		c := g.srv.callFor(k)
		select {
		case <-c.started:
			if how == "cancel" {
				cancel()
			}
			err := <-returned
			cancel()
			if code := status.Code(err); code != codes.Canceled && code != codes.DeadlineExceeded {
				t.Fatalf("the caller that gave up got %v, want CANCELLED or DEADLINE_EXCEEDED", err)
			}
			<-c.served // the handler ran on and its outcome was stored
			g.key = k
		case err := <-returned:
			cancel()
			if how != "deadline" || status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("the call ended before its handler started: %v", err)
			}
		}
	}
	return g
}

// A caller that gives up (cancels, or its deadline passes) after its
// handler started, and before the handler sets its response metadata: the
// handler's context is detached from the caller's, so it runs on, sets
// header and trailer (grpc-go refuses them on the finished stream) and
// returns; the stored outcome must hold them, so every duplicate replays
// them byte for byte, and the handler runs once.
func TestMetadataSetAfterTheCallerGaveUpIsReplayed(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"cancel", "deadline"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			g := giveUp(t, how)
			h := &harness{codec: g.codec}
			var first observed
			for i := range 2 {
				ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), idemgate.KeyHeader, g.key), 30*time.Second)
				o := h.observe(ctx, g.client.Mutate, g.req)
				cancel()
				if o.err != nil || !replayedOnce(o.header) {
					t.Fatalf("duplicate %d: err %v, replayed %v, handler executions %d; want a replay of the one execution",
						i, o.err, replayedOnce(o.header), g.srv.callFor(g.key).executions.Load())
				}
				wantHandlerMetadata(t, "duplicate", o)
				if i == 0 {
					first = o
				} else if !bytes.Equal(o.raw, first.raw) {
					t.Errorf("two duplicates got different bytes: %x and %x", first.raw, o.raw)
				}
			}
			if n := g.srv.callFor(g.key).executions.Load(); n != 1 {
				t.Errorf("the handler ran %d times, want once", n)
			}
		})
	}
}

// A caller that gave up is no reason to warn: grpc-go refuses the gate's
// own headers on the finished stream with "SendHeader called multiple
// times", which is no double send, only a stream nobody reads any more.
func TestCallerThatGaveUpIsNoWarning(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"cancel", "deadline"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			g := giveUp(t, how)
			for _, rec := range g.logs.lines(t, "") {
				if m, _ := rec["msg"].(string); strings.Contains(m, "WithDedupeConn") {
					continue // the gate's start-up warning: the stack gives it no connection
				}
				if rec["level"] == slog.LevelWarn.String() || rec["level"] == slog.LevelError.String() {
					t.Errorf("the gate logged %v for a caller that gave up", rec)
				}
			}
		})
	}
}

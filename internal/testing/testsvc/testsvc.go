// Package testsvc implements the TestService of proto/idemgate/testing: a
// handler that counts its executions and does what each request asks (wait,
// fail, set response metadata), for the interceptor's tests and benchmarks.
package testsvc

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
)

// Server counts executions per method; every method behaves the same.
type Server struct {
	testingv1.UnimplementedTestServiceServer

	executions atomic.Int64
	failFirst  atomic.Int64
	lastCause  atomic.Pointer[error]

	startedMu sync.Mutex
	started   map[string]*startSignal
}

// startSignal is closed once, when the first handler for its payload starts.
type startSignal struct {
	ch   chan struct{}
	once sync.Once
}

// Started returns a channel that is closed once a handler has started running
// a request with this payload, so a test can act "after the side effect began"
// without guessing how long the machine takes to get there.
func (s *Server) Started(payload string) <-chan struct{} { return s.startSignal(payload).ch }

func (s *Server) startSignal(payload string) *startSignal {
	s.startedMu.Lock()
	defer s.startedMu.Unlock()
	if s.started == nil {
		s.started = make(map[string]*startSignal)
	}
	sig, ok := s.started[payload]
	if !ok {
		sig = &startSignal{ch: make(chan struct{})}
		s.started[payload] = sig
	}
	return sig
}

// LastCause is the cause (context.Cause) of the last handler context that
// ended while its handler waited out a delay, or nil.
func (s *Server) LastCause() error {
	if p := s.lastCause.Load(); p != nil {
		return *p
	}
	return nil
}

// Executions is how many times any handler ran.
func (s *Server) Executions() int64 { return s.executions.Load() }

// FailNext makes the next n executions fail with UNAVAILABLE after they
// count as run, as a handler whose downstream call failed would.
func (s *Server) FailNext(n int64) { s.failFirst.Store(n) }

func (s *Server) handle(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	n := s.executions.Add(1)
	sig := s.startSignal(req.GetPayload())
	sig.once.Do(func() { close(sig.ch) })
	if d := req.GetDelay().AsDuration(); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			cause := context.Cause(ctx)
			s.lastCause.Store(&cause)
			// As a provider client would: the context's error, its code
			// DEADLINE_EXCEEDED or CANCELLED.
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if req.GetPanic() {
		panic("testsvc: panicking on request")
	}
	if err := setMetadata(ctx, req); err != nil {
		return nil, err
	}
	if s.failFirst.Add(-1) >= 0 {
		return nil, status.Error(codes.Unavailable, "testsvc: downstream failed on purpose")
	}
	if c := req.GetFailCode(); c != 0 {
		return nil, requestedError(req, n)
	}
	key, _ := idemgate.KeyFromContext(ctx)
	downstream, _ := idemgate.DownstreamKeyFromContext(ctx)
	token, _ := idemgate.FencingTokenFromContext(ctx)
	return &testingv1.MutateResponse{Payload: req.GetPayload(), Execution: n, Key: key, Epoch: token.Epoch, DownstreamKey: downstream}, nil
}

// setMetadata sets the response header and trailer the request asks for.
func setMetadata(ctx context.Context, req *testingv1.MutateRequest) error {
	header := metadata.MD{}
	for _, p := range req.GetSetHeader() {
		if req.GetSendHeader() {
			header.Append(p.GetKey(), string(p.GetValue()))
		} else if err := grpc.SetHeader(ctx, metadata.Pairs(p.GetKey(), string(p.GetValue()))); err != nil {
			return err
		}
	}
	if req.GetSendHeader() {
		if err := grpc.SendHeader(ctx, header); err != nil {
			return err
		}
	}
	for _, p := range req.GetSetTrailer() {
		if err := grpc.SetTrailer(ctx, metadata.Pairs(p.GetKey(), string(p.GetValue()))); err != nil {
			return err
		}
	}
	return nil
}

// requestedError builds the error a request asks for. Its message names the
// execution, so a replay can be told from a fresh run.
func requestedError(req *testingv1.MutateRequest, execution int64) error {
	st := status.Newf(codes.Code(req.GetFailCode()), "testsvc: execution %d failing with code %d on request", execution, req.GetFailCode())
	if d := req.GetFailDetail(); d != "" {
		if withDetail, err := st.WithDetails(&errdetails.ErrorInfo{Reason: d, Domain: "testsvc.idemgate.dev"}); err == nil {
			st = withDetail
		}
	}
	switch req.GetFailMark() {
	case testingv1.ErrorMark_ERROR_MARK_FINAL:
		return idemgate.FinalError(st.Err())
	case testingv1.ErrorMark_ERROR_MARK_RETRYABLE:
		return idemgate.RetryableError(st.Err())
	default:
		return st.Err()
	}
}

// Mutate implements testingv1.TestServiceServer.
func (s *Server) Mutate(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// MutateOther implements testingv1.TestServiceServer.
func (s *Server) MutateOther(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// MutateShortLease implements testingv1.TestServiceServer.
func (s *Server) MutateShortLease(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// MutateReexecute implements testingv1.TestServiceServer.
func (s *Server) MutateReexecute(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// MutateBounded implements testingv1.TestServiceServer.
func (s *Server) MutateBounded(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// MutateHeld implements testingv1.TestServiceServer.
func (s *Server) MutateHeld(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// MutateHeldReexecute implements testingv1.TestServiceServer.
func (s *Server) MutateHeldReexecute(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// MutateAfterReply implements testingv1.TestServiceServer.
func (s *Server) MutateAfterReply(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// MutateAfterReplyReexecute implements testingv1.TestServiceServer.
func (s *Server) MutateAfterReplyReexecute(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// MutateRenamed implements testingv1.TestServiceServer.
func (s *Server) MutateRenamed(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// MutateReplayErrors implements testingv1.TestServiceServer.
func (s *Server) MutateReplayErrors(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// MutateNoWait implements testingv1.TestServiceServer.
func (s *Server) MutateNoWait(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// MutateKeyless implements testingv1.TestServiceServer.
func (s *Server) MutateKeyless(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// Watch implements testingv1.TestServiceServer: it sends the request's
// payload twice, counting as one execution.
func (s *Server) Watch(req *testingv1.MutateRequest, stream testingv1.TestService_WatchServer) error {
	n := s.executions.Add(1)
	for range 2 {
		if err := stream.Send(&testingv1.MutateResponse{Payload: req.GetPayload(), Execution: n}); err != nil {
			return err
		}
	}
	return nil
}

// Read implements testingv1.TestServiceServer.
func (s *Server) Read(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// Put implements testingv1.TestServiceServer.
func (s *Server) Put(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

// Unmarked implements testingv1.TestServiceServer.
func (s *Server) Unmarked(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	return s.handle(ctx, req)
}

package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/gen/idemgate/testing/v1/testingv1connect"
	"github.com/idemgate/idemgate/internal/testing/chaos"
)

// The Connect callers' retry layers, below the application loop: a
// transport-level retry as go-grpc-middleware's retry interceptor does for
// gRPC (connect-go has none of its own): up to connectTries tries on
// UNAVAILABLE and ABORTED and on a per-try timeout, with exponential backoff
// and jitter; below it, net/http's resend of a replayable request (one with
// an Idempotency-Key header) when a reused connection fails before any
// answer.
const (
	connectTries       = 3
	connectBackoffBase = 200 * time.Millisecond
	connectBackoffMax  = 2 * time.Second
)

// connectCaller is the callers' Connect client (the Connect protocol, binary
// protobuf) of one tool server's -connect-listen address.
type connectCaller struct {
	target     string
	client     testingv1connect.ChaosServiceClient
	httpClient *http.Client
	codec      *capturingConnectCodec
	tryTimeout time.Duration
	history    *historyWriter
}

func newConnectCaller(target string, tryTimeout time.Duration, history *historyWriter) *connectCaller {
	httpClient := &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 128,
		IdleConnTimeout:     90 * time.Second,
	}}
	codec := &capturingConnectCodec{received: map[proto.Message][]byte{}}
	return &connectCaller{target: target, httpClient: httpClient, codec: codec, tryTimeout: tryTimeout, history: history,
		client: testingv1connect.NewChaosServiceClient(httpClient, "http://"+target, connect.WithCodec(codec))}
}

func (cc *connectCaller) close() { cc.httpClient.CloseIdleConnections() }

// callAction is one caller's application loop for one action, over
// Connect: every attempt and every try of it sends the action's key in the
// idempotency-key header.
func (cc *connectCaller) callAction(ctx context.Context, c config, a action, callerID int) {
	msg := &testingv1.ChargeRequest{Action: a.name, AmountCents: 4200}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d/connect", a.key, callerID)
	rng := rand.New(rand.NewPCG(c.seed, h.Sum64()))
	applicationLoop(ctx, c, a, callerID, func(ctx context.Context, attempt int) (codes.Code, time.Duration) {
		var code codes.Code
		var retryDelay time.Duration
		for try := 1; ; try++ {
			code, retryDelay = cc.try(ctx, a, callerID, attempt, try, msg)
			retry := code == codes.Unavailable || code == codes.Aborted || code == codes.DeadlineExceeded
			if !retry || try == connectTries || ctx.Err() != nil {
				return code, retryDelay
			}
			delay := min(connectBackoffMax, connectBackoffBase<<(try-1))
			delay += time.Duration(rng.Int64N(int64(delay) / 5))
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return code, retryDelay
			}
		}
	})
}

// try sends the request once, under the per-try timeout, and records it.
func (cc *connectCaller) try(ctx context.Context, a action, callerID, attempt, try int, msg *testingv1.ChargeRequest) (codes.Code, time.Duration) {
	rec := chaos.Attempt{Action: a.name, Key: a.key, Method: a.method, Caller: callerID, Attempt: attempt, Try: try, Target: cc.target, Start: time.Now()}
	tctx, cancel := context.WithTimeout(ctx, cc.tryTimeout)
	defer cancel()
	req := connect.NewRequest(msg)
	req.Header().Set(idemgate.KeyHeader, a.key)
	var resp *connect.Response[testingv1.ChargeResponse]
	var err error
	if a.method == testingv1.ChaosService_ChargeReexecute_FullMethodName {
		resp, err = cc.client.ChargeReexecute(tctx, req)
	} else {
		resp, err = cc.client.Charge(tctx, req)
	}
	rec.End = time.Now()
	code := codes.OK
	var retryDelay time.Duration
	if err != nil {
		code = codes.Code(connect.CodeOf(err))
		if ce, ok := err.(*connect.Error); ok {
			for _, d := range ce.Details() {
				switch v, _ := d.Value(); v := v.(type) {
				case *errdetails.ErrorInfo:
					rec.Reason = v.GetReason()
				case *errdetails.RetryInfo:
					retryDelay = v.GetRetryDelay().AsDuration()
				}
			}
		}
	} else {
		rec.Response = cc.codec.take(resp.Msg)
		rec.Replayed = resp.Header().Get(idemgate.ReplayedHeader) == "true"
	}
	if err == nil && rec.Response == nil {
		code = codes.Internal // the codec saw no body: record no OK it cannot prove
	}
	rec.Code = code.String()
	cc.history.write(rec)
	return code, retryDelay
}

// capturingConnectCodec is connect-go's binary protobuf codec, keeping the
// bytes of each message it decoded, as they arrived, until take.
type capturingConnectCodec struct {
	mu       sync.Mutex
	received map[proto.Message][]byte
}

func (*capturingConnectCodec) Name() string { return "proto" }

func (*capturingConnectCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("capturing codec: %T is not a proto.Message", v)
	}
	return proto.Marshal(m)
}

func (c *capturingConnectCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("capturing codec: %T is not a proto.Message", v)
	}
	c.mu.Lock()
	c.received[m] = append([]byte(nil), data...)
	c.mu.Unlock()
	return proto.Unmarshal(data, m)
}

// take returns and forgets the bytes m was decoded from.
func (c *capturingConnectCodec) take(m proto.Message) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.received[m]
	delete(c.received, m)
	return b
}

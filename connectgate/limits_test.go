package connectgate_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/connectgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/gen/idemgate/testing/v1/testingv1connect"
	"github.com/idemgate/idemgate/internal/testing/connectbomb"
)

// wantNotReserved checks the handler never ran and key was not reserved: a
// small request with it now runs, as the first execution, not a replay.
func wantNotReserved(t *testing.T, hs *harness, client testingv1connect.TestServiceClient, key string) {
	t.Helper()
	if n := hs.h.executions.Load(); n != 0 {
		t.Fatalf("the handler ran %d times for a refused request", n)
	}
	resp, err := client.Mutate(testCtx(t), keyed(key, &testingv1.MutateRequest{Payload: "small"}))
	if err != nil {
		t.Fatalf("a small request with the refused request's key: %v", err)
	}
	if resp.Msg.GetExecution() != 1 || resp.Header().Get(idemgate.ReplayedHeader) != "" {
		t.Fatalf("a small request with the refused request's key: execution %d, headers %v; want the first execution, not a replay",
			resp.Msg.GetExecution(), resp.Header())
	}
	hs.h.executions.Store(0)
}

// A gzip body that inflates past WithMaxRequestBytes (a 64 MiB field in a
// 64 KB body, over the default 4 MiB) is refused while it is decompressed,
// over every protocol, with RESOURCE_EXHAUSTED and
// IDEMPOTENCY_REQUEST_TOO_LARGE: the gate never reserves the key and the
// handler never runs. Under an interceptor alone (no HandlerOptions)
// connect-go inflated it whole and the handler ran.
func TestGzipBombRefusedBeforeDecoding(t *testing.T) {
	hs := setup(t, nil)
	bomb := connectbomb.Gzip(64<<20, nil)
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			key := "bomb-" + p.name
			_, err := hs.client(append(connectbomb.ClientOptions(bomb), p.opts...)...).Mutate(testCtx(t), keyed(key, &testingv1.MutateRequest{Payload: "x"}))
			wantError(t, err, connect.CodeResourceExhausted, connectgate.ReasonRequestTooLarge)
			wantNotReserved(t, hs, hs.client(p.opts...), key)
		})
	}
}

// lengthHidden sends requests without their Content-Length, as a streamed
// (chunked) body, so only the bytes read can tell they are over the limit.
type lengthHidden struct{ next http.RoundTripper }

func (l lengthHidden) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.ContentLength, r.GetBody = -1, nil
	r.Body = io.NopCloser(r.Body)
	return l.next.RoundTrip(r)
}

// envelopeLie announces a 1 GiB message in a request's envelope prefix and
// sends the real, small one.
type envelopeLie struct{ next http.RoundTripper }

func (l envelopeLie) RoundTrip(r *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint32(body[1:5], 1<<30)
	r = r.Clone(r.Context())
	r.Body, r.GetBody = io.NopCloser(bytes.NewReader(body)), nil
	return l.next.RoundTrip(r)
}

// payloadOf is a MutateRequest payload that makes the encoded request n
// bytes long (a 1-byte tag and a 3-byte length, for n from 2^14+4 to 2^21).
func payloadOf(n int) string { return strings.Repeat("p", n-4) }

// A request message over WithMaxRequestBytes, sent plainly, is refused
// before it is decoded over every protocol, with RESOURCE_EXHAUSTED and
// IDEMPOTENCY_REQUEST_TOO_LARGE, whether its Content-Length says so, its
// body streams without one, or (gRPC, gRPC-Web) its envelope announces
// more than it sends; the key is not reserved and the handler does not run.
// A message of exactly the limit runs, plain and gzip-compressed.
func TestRequestOverLimitRefusedBeforeDecoding(t *testing.T) {
	const limit = 64 << 10
	hs := setup(t, nil, connectgate.WithMaxRequestBytes(limit))
	clientWith := func(rt func(http.RoundTripper) http.RoundTripper, opts ...connect.ClientOption) testingv1connect.TestServiceClient {
		return testingv1connect.NewTestServiceClient(&http.Client{Transport: rt(hs.http.Transport)}, hs.url, opts...)
	}
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			cases := []struct {
				name string
				rt   func(http.RoundTripper) http.RoundTripper
			}{
				{"content-length", func(rt http.RoundTripper) http.RoundTripper { return rt }},
				{"streamed", func(rt http.RoundTripper) http.RoundTripper { return lengthHidden{rt} }},
			}
			if p.name != "connect" {
				cases = append(cases, struct {
					name string
					rt   func(http.RoundTripper) http.RoundTripper
				}{"envelope-lie", func(rt http.RoundTripper) http.RoundTripper { return envelopeLie{rt} }})
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					key := "big-" + p.name + "-" + c.name
					size := limit + 1
					if c.name == "envelope-lie" {
						size = 100
					}
					_, err := clientWith(c.rt, p.opts...).Mutate(testCtx(t), keyed(key, &testingv1.MutateRequest{Payload: payloadOf(size)}))
					wantError(t, err, connect.CodeResourceExhausted, connectgate.ReasonRequestTooLarge)
					wantNotReserved(t, hs, hs.client(p.opts...), key)
				})
			}
			for _, gz := range []bool{false, true} {
				opts := p.opts
				if gz {
					opts = append(append([]connect.ClientOption{}, opts...), connect.WithSendGzip())
				}
				resp, err := clientWith(func(rt http.RoundTripper) http.RoundTripper { return lengthHidden{rt} }, opts...).
					Mutate(testCtx(t), keyed("at-limit-"+p.name+map[bool]string{true: "-gzip"}[gz], &testingv1.MutateRequest{Payload: payloadOf(limit)}))
				if err != nil || len(resp.Msg.GetPayload()) != limit-4 {
					t.Fatalf("a request of exactly the limit (gzip %v): %v", gz, err)
				}
			}
			hs.h.executions.Store(0)
		})
	}
}

// A response over WithMaxResponseBytes (as sent: compressed when the
// client accepts it) is not sent: the caller gets connect-go's
// RESOURCE_EXHAUSTED instead of the response buffered whole.
func TestResponseOverLimitNotSent(t *testing.T) {
	hs := setup(t, nil, connectgate.WithMaxResponseBytes(1<<10), connectgate.WithMaxOutcomeBytes(1<<10))
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			// Not accepting gzip, so the response is sent as large as it is.
			client := hs.client(append([]connect.ClientOption{connect.WithAcceptCompression("gzip", nil, nil)}, p.opts...)...)
			_, err := client.Mutate(testCtx(t), keyed("big-response-"+p.name, &testingv1.MutateRequest{Payload: strings.Repeat("r", 2<<10)}))
			if connect.CodeOf(err) != connect.CodeResourceExhausted {
				t.Fatalf("a 2 KiB response over a 1 KiB limit: %v, want RESOURCE_EXHAUSTED", err)
			}
		})
	}
}

// Limits that are not positive fail New.
func TestLimitsMustBePositive(t *testing.T) {
	hs := setup(t, nil)
	for _, opt := range []connectgate.Option{connectgate.WithMaxRequestBytes(0), connectgate.WithMaxResponseBytes(-1)} {
		if _, err := connectgate.New(hs.stack.Dedupe, opt); err == nil {
			t.Fatal("New with a limit that is not positive: nil error")
		}
	}
	// An outcome stored within WithMaxOutcomeBytes but over the response
	// limit could never be sent to a duplicate: refused, naming both.
	_, err := connectgate.New(hs.stack.Dedupe, connectgate.WithMaxOutcomeBytes(2<<20), connectgate.WithMaxResponseBytes(1<<20))
	if err == nil || !strings.Contains(err.Error(), "WithMaxOutcomeBytes") || !strings.Contains(err.Error(), "WithMaxResponseBytes") {
		t.Fatalf("New with the outcome limit over the response limit: %v, want an error naming both options", err)
	}
}

// An option among HandlerOptions' extra that would undo the gate's limits
// (connect-go's read or send limit, its own gzip, even inside
// connect.WithHandlerOptions) is refused where the handler is built, naming
// the gate's option to use, instead of being silently overridden; other
// compressions and options pass.
func TestHandlerOptionsRefuseConflictingLimits(t *testing.T) {
	gate, err := connectgate.New(setup(t, nil).stack.Dedupe)
	if err != nil {
		t.Fatal(err)
	}
	refused := []struct {
		name string
		opt  connect.HandlerOption
		want string
	}{
		{"WithReadMaxBytes", connect.WithReadMaxBytes(1 << 30), "WithMaxRequestBytes"},
		{"WithSendMaxBytes", connect.WithSendMaxBytes(1 << 30), "WithMaxResponseBytes"},
		{"gzip WithCompression", connect.WithCompression("gzip", nil, nil), "WithMaxRequestBytes"},
		{"WithReadMaxBytes in WithHandlerOptions", connect.WithHandlerOptions(connect.WithRecover(nil), connect.WithReadMaxBytes(1)), "WithMaxRequestBytes"},
	}
	for _, c := range refused {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				p := recover()
				if p == nil || !strings.Contains(fmt.Sprint(p), c.want) {
					t.Fatalf("HandlerOptions(%s): panic %v, want a refusal naming connectgate.%s", c.name, p, c.want)
				}
			}()
			gate.HandlerOptions(c.opt)
		})
	}
	// Another compression, a codec, interceptors: the gate's limits hold.
	opts := gate.HandlerOptions(connect.WithCompression("br", nil, nil), connect.WithRecover(nil),
		connect.WithHandlerOptions(connect.WithCompressMinBytes(1)))
	if len(opts) == 0 {
		t.Fatal("no options")
	}
}

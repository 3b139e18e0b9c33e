package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/httpgate"
	"github.com/idemgate/idemgate/internal/testing/chaos"
)

// The HTTP callers' retry layers, below the application loop:
//
//   - transport-level, as HTTP client libraries retry (go-retryablehttp,
//     urllib3's Retry, ...): up to httpTries tries of a request, on a
//     connection error, a per-try timeout (the client's Timeout), 429, 502,
//     503 and 504, with exponential backoff and jitter, at least the
//     answer's Retry-After;
//   - net/http's own: a request with an Idempotency-Key header is
//     replayable, so the Transport resends it on a fresh connection when a
//     reused one fails before any answer (as grpc-go's transparent retry).
const (
	httpTries       = 3
	httpBackoffBase = 200 * time.Millisecond
	httpBackoffMax  = 2 * time.Second
)

// httpCaller is the callers' client of one tool server's HTTP address.
type httpCaller struct {
	target, base string
	client       *http.Client
	history      *historyWriter
}

// newHTTPCaller returns the client of target with a per-try timeout of
// tryTimeout, recording every try to history.
func newHTTPCaller(target string, tryTimeout time.Duration, history *historyWriter) *httpCaller {
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 128,
		IdleConnTimeout:     90 * time.Second,
	}
	return &httpCaller{target: target, base: "http://" + target, history: history,
		client: &http.Client{Transport: transport, Timeout: tryTimeout}}
}

func (hc *httpCaller) close() { hc.client.CloseIdleConnections() }

// callAction is one caller's application loop for one action, over HTTP:
// every attempt and every try of it sends the action's key.
func (hc *httpCaller) callAction(ctx context.Context, c config, a action, callerID int) {
	body, err := protojson.Marshal(&testingv1.ChargeRequest{Action: a.name, AmountCents: 4200})
	if err != nil {
		panic(err) // a ChargeRequest always marshals
	}
	url := hc.base + chaos.HTTPPath(a.method)
	// The transport layer's jitter, from the caller's own seed.
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d/http", a.key, callerID)
	rng := rand.New(rand.NewPCG(c.seed, h.Sum64()))
	applicationLoop(ctx, c, a, callerID, func(ctx context.Context, attempt int) (codes.Code, time.Duration) {
		var code codes.Code
		var retryAfter time.Duration
		for try := 1; ; try++ {
			var retry bool
			code, retryAfter, retry = hc.try(ctx, a, callerID, attempt, try, url, body)
			if !retry || try == httpTries || ctx.Err() != nil {
				return code, retryAfter
			}
			delay := min(httpBackoffMax, httpBackoffBase<<(try-1))
			delay += time.Duration(rng.Int64N(int64(delay) / 5))
			delay = max(delay, retryAfter)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return code, retryAfter
			}
		}
	})
}

// try sends the request once and records it: the gRPC code its answer
// stands for, its Retry-After, and whether the transport layer retries it.
func (hc *httpCaller) try(ctx context.Context, a action, callerID, attempt, try int, url string, body []byte) (code codes.Code, retryAfter time.Duration, retry bool) {
	rec := chaos.Attempt{Action: a.name, Key: a.key, Method: a.method, Caller: callerID, Attempt: attempt, Try: try, Target: hc.target, Start: time.Now()}
	defer func() {
		rec.End = time.Now()
		rec.Code = code.String()
		hc.history.write(rec)
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return codes.Internal, 0, false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", chaos.HTTPProtoContentType)
	req.Header.Set(httpgate.KeyHeader, sfString(a.key))
	resp, err := hc.client.Do(req)
	if err != nil {
		code = transportErrorCode(ctx, err)
		return code, 0, code != codes.Canceled && ctx.Err() == nil
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		// The answer was cut off: as a connection error.
		code = transportErrorCode(ctx, err)
		return code, 0, code != codes.Canceled && ctx.Err() == nil
	}
	var problem httpgate.Problem
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct == httpgate.ProblemContentType {
		_ = json.Unmarshal(got, &problem)
	}
	rec.Reason = problem.Reason
	code = chaos.HTTPCode(resp.StatusCode, problem.Reason)
	if code == codes.OK {
		rec.Response = got
		rec.Replayed = resp.Header.Get(httpgate.ReplayedHeader) == "true"
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		retryAfter = time.Duration(s) * time.Second
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		retry = true
	}
	return code, retryAfter, retry
}

// transportErrorCode is the code a failed exchange is recorded with: the
// action's own deadline or cancellation, a per-try timeout
// (DEADLINE_EXCEEDED), or a connection error (UNAVAILABLE).
func transportErrorCode(ctx context.Context, err error) codes.Code {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case ctx.Err() != nil:
		return codes.Canceled
	}
	var timeout interface{ Timeout() bool }
	if errors.As(err, &timeout) && timeout.Timeout() {
		return codes.DeadlineExceeded
	}
	return codes.Unavailable
}

// sfString is key as the draft's sf-string: quoted, with \ and " escaped.
func sfString(key string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

package httpgate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/httpgate"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/gatetest"
)

// TestConformance runs the gate conformance suite against httpgate: each
// ConformanceService method is the route POST /conformance/{Method} with the
// method's policy (httpgate.WithRoute), its body the request as protojson,
// served on loopback TCP (httptest.Server) to Go's http.Client.
//
// A success is 200 with the response as protojson. A handler's Failure is
// the status google/rpc/code.proto gives its code (httpStatus) with the
// body {"code": "FAILED_PRECONDITION", "message": ...} and the Failure's
// mark (MarkFinal, ...); an error wrapping the context's is answered
// unmarked with its code's status (504, 499 or 500), which httpgate's
// "the context had already ended" rule takes as an unknown outcome, as the
// interceptor does a returned context error. A refusal is the gate's
// problem details; the client maps its reason back to the gRPC code the
// other gates give it (reasonCodes).
//
// httpgate fingerprints the whole body and has no per-field exclusion, so
// the request's exclude_from_fingerprint fields (behaviour) travel as
// protojson in the unfingerprinted header Conformance-Control instead.
func TestConformance(t *testing.T) {
	gatetest.Run(t, newConformanceGate)
}

const controlHeader = "Conformance-Control"

var conformanceService = testingv1.File_idemgate_testing_v1_conformance_proto.Services().ByName("ConformanceService")

// httpStatus is google/rpc/code.proto's HTTP mapping of a gRPC code.
var httpStatus = map[codes.Code]int{
	codes.OK: 200, codes.Canceled: 499, codes.Unknown: 500, codes.InvalidArgument: 400, codes.DeadlineExceeded: 504,
	codes.NotFound: 404, codes.AlreadyExists: 409, codes.PermissionDenied: 403, codes.ResourceExhausted: 429,
	codes.FailedPrecondition: 400, codes.Aborted: 409, codes.OutOfRange: 400, codes.Unimplemented: 501,
	codes.Internal: 500, codes.Unavailable: 503, codes.DataLoss: 500, codes.Unauthenticated: 401,
}

// reasonCodes is the gRPC code each refusal reason carries on the other
// gates (gatecore and the interceptor), for the problems' reasons.
var reasonCodes = map[string]codes.Code{
	idemgate.ReasonKeyMissing: codes.InvalidArgument, idemgate.ReasonKeyInvalid: codes.InvalidArgument,
	idemgate.ReasonKeyReused: codes.FailedPrecondition,
	idemgate.ReasonInFlight:  codes.Aborted, idemgate.ReasonOutcomeUnknown: codes.FailedPrecondition,
	idemgate.ReasonResultTooLarge: codes.FailedPrecondition, idemgate.ReasonStoreUnavailable: codes.Unavailable,
	idemgate.ReasonQuotaExceeded: codes.ResourceExhausted, idemgate.ReasonStoreRejected: codes.Internal,
	idemgate.ReasonOutcomeTypeMismatch: codes.Internal, httpgate.ReasonRequestTooLarge: codes.InvalidArgument,
	httpgate.ReasonUnauthenticated: codes.Unauthenticated,
}

// routePolicy is the RoutePolicy of a method's (idemgate.v1.policy).
func routePolicy(md protoreflect.MethodDescriptor) (httpgate.RoutePolicy, error) {
	mp, _ := proto.GetExtension(md.Options(), idemgatev1.E_Policy).(*idemgatev1.MethodPolicy)
	if len(mp.GetUnknownCodes()) > 0 {
		return httpgate.RoutePolicy{}, fmt.Errorf("%w: httpgate cannot express unknown_codes for %s", gatetest.ErrUnsupported, md.Name())
	}
	p := httpgate.RoutePolicy{
		Lease:            mp.GetLease().AsDuration(),
		MaxWait:          mp.GetMaxWait().AsDuration(),
		ExecutionTimeout: mp.GetExecutionTimeout().AsDuration(),
		Retention:        mp.GetRetention().AsDuration(),
		OnLostOutcome:    mp.GetOnLostOutcome(),
		FinishAfterReply: mp.GetFinish() == idemgatev1.FinishPolicy_FINISH_POLICY_AFTER_REPLY,
	}
	if mp.GetMaxWait() != nil && p.MaxWait == 0 {
		// RoutePolicy reads a zero MaxWait as the default (3s); NoWait is
		// max_wait 0.
		p.NoWait = true
	}
	// replay_codes: httpgate stores every 4xx or every 5xx, or none; a code
	// listed turns on the class of the status the driver gives it.
	for _, name := range mp.GetReplayCodes() {
		c, ok := grpcerr.CodeByName(name)
		if !ok {
			return httpgate.RoutePolicy{}, fmt.Errorf("%s: replay code %q", md.Name(), name)
		}
		p.ReplayClientErrors = p.ReplayClientErrors || httpStatus[c]/100 == 4
		p.ReplayServerErrors = p.ReplayServerErrors || httpStatus[c]/100 == 5
	}
	return p, nil
}

func newConformanceGate(t *testing.T, cfg gatetest.Config) gatetest.Client {
	t.Helper()
	dconn, err := grpc.NewClient(cfg.DedupeAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
	if err != nil {
		t.Fatalf("dial the Dedupe service: %v", err)
	}
	t.Cleanup(func() { _ = dconn.Close() })
	opts := []httpgate.Option{httpgate.WithLogger(quiet()), httpgate.WithDedupeConn(dconn),
		httpgate.WithInFlightRetryAfter(200 * time.Millisecond), httpgate.WithStoreRetryAfter(200 * time.Millisecond)}
	if cfg.ReplayCache {
		opts = append(opts, httpgate.WithReplayCache(256, 1<<20))
	}
	mux := http.NewServeMux()
	unsupported := map[string]error{}
	for _, m := range gatetest.Methods {
		p, err := routePolicy(conformanceService.Methods().ByName(protoreflect.Name(m)))
		if err != nil {
			unsupported[m] = err
			continue
		}
		opts = append(opts, httpgate.WithRoute("POST /conformance/"+m, p))
		mux.Handle("POST /conformance/"+m, conformanceHandler(m, cfg.Handler))
	}
	gate, err := httpgate.New(idemgatev1.NewDedupeServiceClient(dconn), "conformance", opts...)
	if err != nil {
		t.Fatalf("httpgate.New: %v", err)
	}
	ts := httptest.NewServer(gate.Handler(mux))
	t.Cleanup(func() {
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	return conformanceClient{url: ts.URL + "/conformance/", http: ts.Client(), unsupported: unsupported}
}

// conformanceHandler serves the suite's handler on one method's route.
func conformanceHandler(method string, handle gatetest.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, control := &testingv1.ConformanceRequest{}, &testingv1.ConformanceRequest{}
		body, err := io.ReadAll(r.Body)
		if ctl := r.Header.Get(controlHeader); err == nil && ctl != "" {
			err = protojson.Unmarshal([]byte(ctl), control)
		}
		if err == nil {
			err = protojson.Unmarshal(body, req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		proto.Merge(req, control)
		resp, err := handle(r.Context(), method, req)
		if err == nil {
			out, _ := protojson.Marshal(resp)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(out)
			return
		}
		code, message := status.FromContextError(err).Code(), err.Error()
		var f *gatetest.Failure
		if errors.As(err, &f) {
			code, message = f.Code, f.Message
			switch f.Kind {
			case gatetest.Final:
				httpgate.MarkFinal(w)
			case gatetest.Retryable:
				httpgate.MarkRetryable(w)
			case gatetest.OutcomeUnknown:
				httpgate.MarkOutcomeUnknown(w)
			}
		}
		out, _ := json.Marshal(map[string]string{"code": grpcerr.CodeName(code), "message": message})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(httpStatus[code])
		_, _ = w.Write(out)
	})
}

type conformanceClient struct {
	url         string
	http        *http.Client
	unsupported map[string]error
}

func (c conformanceClient) Call(ctx context.Context, method, key string, req *testingv1.ConformanceRequest) gatetest.Answer {
	if err := c.unsupported[method]; err != nil {
		return gatetest.Answer{Err: err, Code: codes.Unimplemented}
	}
	body, control := proto.Clone(req), &testingv1.ConformanceRequest{}
	fields := req.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if fp, _ := proto.GetExtension(f.Options(), idemgatev1.E_Field).(*idemgatev1.FieldPolicy); fp.GetExcludeFromFingerprint() {
			control.ProtoReflect().Set(f, req.ProtoReflect().Get(f))
			body.ProtoReflect().Clear(f)
		}
	}
	b, _ := protojson.Marshal(body)
	ctl, _ := protojson.Marshal(control)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+method, bytes.NewReader(b))
	if err != nil {
		return gatetest.Answer{Code: codes.Internal, Err: err}
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set(controlHeader, string(ctl))
	if key != "" {
		hr.Header.Set(httpgate.KeyHeader, strconv.Quote(key)) // the draft's sf-string; the keys are plain ASCII
	}
	res, err := c.http.Do(hr)
	if err == nil {
		defer func() { _ = res.Body.Close() }()
		b, err = io.ReadAll(res.Body)
	}
	if err != nil {
		code := codes.Unknown
		if ctx.Err() != nil {
			code = status.FromContextError(ctx.Err()).Code()
		}
		return gatetest.Answer{Code: code, Err: err}
	}
	a := gatetest.Answer{Body: b, Replayed: res.Header.Get(httpgate.ReplayedHeader) == "true"}
	if res.StatusCode/100 == 2 {
		a.Response = &testingv1.ConformanceResponse{}
		if err := protojson.Unmarshal(b, a.Response); err != nil {
			return gatetest.Answer{Code: codes.Internal, Err: fmt.Errorf("HTTP %d is no ConformanceResponse: %w (%s)", res.StatusCode, err, b)}
		}
		return a
	}
	a.Code, a.Err = codes.Unknown, fmt.Errorf("HTTP %d: %s", res.StatusCode, b)
	if strings.HasPrefix(res.Header.Get("Content-Type"), httpgate.ProblemContentType) {
		var p httpgate.Problem
		_ = json.Unmarshal(b, &p)
		a.Reason = p.Reason
		if code, ok := reasonCodes[p.Reason]; ok {
			a.Code = code
		}
		if s, err := strconv.Atoi(res.Header.Get("Retry-After")); err == nil {
			a.RetryAfter = time.Duration(s) * time.Second
		}
		return a
	}
	var e struct{ Code string }
	if json.Unmarshal(b, &e) == nil {
		if code, ok := grpcerr.CodeByName(e.Code); ok {
			a.Code = code
		}
	}
	return a
}

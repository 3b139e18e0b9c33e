package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/httpgate"
	"github.com/idemgate/idemgate/internal/testing/chaos"
)

// httpListen is the -http-listen flag.
var httpListen string

// httpMethods are the gRPC methods the HTTP routes stand for
// (chaos.HTTPPath), which the ledger names.
var httpMethods = []string{testingv1.ChaosService_Charge_FullMethodName, testingv1.ChaosService_ChargeReexecute_FullMethodName}

// newHTTPGate is httpgate with the routes' policies: those of the proto
// methods they stand for (proto/idemgate/testing/v1/chaos.proto): a 6s
// lease, a 2s max_wait, FAIL_CLOSED for /charge and REEXECUTE for
// /charge-reexecute.
func newHTTPGate(dedupe idemgatev1.DedupeServiceClient, conn *grpc.ClientConn, defaultBackoff bool, logger *slog.Logger) (*httpgate.Gate, error) {
	opts := []httpgate.Option{
		httpgate.WithLogger(logger),
		httpgate.WithRoute("POST "+chaos.HTTPChargePath, httpgate.RoutePolicy{Lease: 6 * time.Second, MaxWait: 2 * time.Second,
			OnLostOutcome: idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED}),
		httpgate.WithRoute("POST "+chaos.HTTPChargeReexecutePath, httpgate.RoutePolicy{Lease: 6 * time.Second, MaxWait: 2 * time.Second,
			OnLostOutcome: idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_REEXECUTE}),
	}
	if defaultBackoff {
		opts = append(opts, httpgate.WithDedupeConn(conn))
	}
	return httpgate.New(dedupe, "chaos-tool", opts...)
}

// serveHTTP serves the ChaosService handler logic of s on addr, gated by
// gate; the caller shuts the returned server down.
func serveHTTP(addr string, gate *httpgate.Gate, s *server, logger *slog.Logger) (*http.Server, error) {
	mux := http.NewServeMux()
	for _, method := range httpMethods {
		mux.HandleFunc("POST "+chaos.HTTPPath(method), func(w http.ResponseWriter, r *http.Request) { s.serveCharge(w, r, method) })
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	hsrv := &http.Server{Handler: gate.Handler(mux), ReadHeaderTimeout: time.Minute, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	go func() {
		if err := hsrv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("HTTP server failed", slog.Any("error", err))
		}
	}()
	logger.Info("chaos tool serving HTTP", slog.String("address", lis.Addr().String()),
		slog.String("charge", "POST "+chaos.HTTPChargePath), slog.String("charge-reexecute", "POST "+chaos.HTTPChargeReexecutePath))
	return hsrv, nil
}

// serveCharge is the HTTP handler of one route: the request decoded, the
// charge executed as the gRPC handler does, and its answer: 200 with the
// side effect's response bytes, or a problem, marked for the gate.
func (s *server) serveCharge(w http.ResponseWriter, r *http.Request, method string) {
	key, err := httpgate.ParseKey(r.Header.Get(httpgate.KeyHeader))
	if err != nil {
		// The gate refuses an unusable key before it calls the handler.
		s.problem(w, http.StatusBadRequest, "Idempotency-Key unusable", err.Error(), false)
		return
	}
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		s.problem(w, http.StatusBadRequest, "Request unreadable", err.Error(), false)
		return
	}
	req := &testingv1.ChargeRequest{}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct == "application/json" {
		err = protojson.Unmarshal(raw, req)
	} else {
		err = proto.Unmarshal(raw, req)
	}
	if err != nil {
		s.problem(w, http.StatusBadRequest, "Invalid ChargeRequest", err.Error(), false)
		return
	}
	_, body, err := s.execute(r.Context(), req, execution{key: key, method: method})
	switch {
	case err == nil:
		w.Header().Set("Content-Type", chaos.HTTPProtoContentType)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body)
	case errors.Is(err, errAmbiguous):
		// The charge may have happened: the outcome is unknown.
		s.problem(w, http.StatusGatewayTimeout, "Provider timed out", err.Error(), true)
	case r.Context().Err() != nil:
		// Cut short by the handler's context (fenced, or past its
		// execution timeout): a 5xx after the context ended, which the
		// gate marks unknown on its own.
		s.problem(w, http.StatusGatewayTimeout, "Provider call cut short", err.Error(), false)
	default:
		s.problem(w, http.StatusInternalServerError, "Internal error", err.Error(), false)
	}
}

// problem answers with an RFC 9457 problem of the handler's own (no
// idemgate reason). unknown marks it httpgate.MarkOutcomeUnknown; with the
// broken layer on, every failure is marked httpgate.MarkRetryable instead,
// so the gate releases the key and a retry charges again.
func (s *server) problem(w http.ResponseWriter, status int, title, detail string, unknown bool) {
	switch {
	case s.broken:
		httpgate.MarkRetryable(w)
	case unknown:
		httpgate.MarkOutcomeUnknown(w)
	}
	body, err := json.Marshal(httpgate.Problem{Type: "about:blank", Title: title, Status: status, Detail: detail})
	if err != nil {
		body = []byte(fmt.Sprintf(`{"title":%q,"status":%d}`, title, status))
	}
	w.Header().Set("Content-Type", httpgate.ProblemContentType)
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

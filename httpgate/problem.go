package httpgate

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// Reasons of the refusals only HTTP has, the "reason" member of their
// problem details; every other refusal carries one of package idemgate's
// reasons (idemgate.ReasonKeyMissing and the rest), the same as the other
// gates'. Each is answered with the status StatusOf gives, chosen so that a
// generic retrying client (got, axios-retry, urllib3's Retry) retries only
// what a retry can settle: docs/gating.md "What an HTTP caller does with
// each refusal" is the table, with what the caller does.
const (
	// ReasonRequestTooLarge: the request body is over the route's
	// MaxBodyBytes, so it could not be fingerprinted; nothing ran (413).
	ReasonRequestTooLarge = "IDEMPOTENCY_REQUEST_TOO_LARGE"
	// ReasonUnauthenticated: the TenantFunc refused the request (401).
	ReasonUnauthenticated = "IDEMPOTENCY_UNAUTHENTICATED"
)

// ProblemContentType is the media type of a refusal's body (RFC 9457).
const ProblemContentType = "application/problem+json"

// Problem is the RFC 9457 problem details body of a refusal.
type Problem struct {
	// Type is a URI naming the kind of problem: WithProblemTypeBase plus
	// the reason in lower case with dashes (ProblemType), by default the
	// reason's section of docs/gating.md on GitHub.
	Type string `json:"type"`
	// Title is the kind of problem in a few words.
	Title string `json:"title"`
	// Status is the HTTP status code.
	Status int `json:"status"`
	// Detail says what happened and what to do.
	Detail string `json:"detail"`
	// Reason is the stable idemgate reason (IDEMPOTENCY_KEY_MISSING, ...).
	Reason string `json:"reason,omitempty"`
	// RetryAfter is the number of seconds after which a retry with the same
	// key helps, as the Retry-After header says; absent when it does not.
	RetryAfter int `json:"retry_after,omitempty"`
	// Metadata is the refusal's detail as the gRPC gate's ErrorInfo carries
	// it (quota, size_bytes, cause, key).
	Metadata map[string]string `json:"metadata,omitempty"`
}

// refusal is how one reason is answered: the status, the title, and
// whether the answer carries Retry-After.
type refusal struct {
	status int
	title  string
	retry  retryAfter
}

// retryAfter says when a refusal carries Retry-After (from the core's
// RetryInfo): the docs' table and this one are held to each other.
type retryAfter int

const (
	retryNever retryAfter = iota
	retryAlways
	// retryRate: only for a rate quota, which refills.
	retryRate
)

// refusals is the status table docs/gating.md "What an HTTP caller does
// with each refusal" and doc.go document. A refusal a retry cannot settle
// gets a status generic retriers leave alone (a 4xx other than 408 and
// 429, 413 without Retry-After, or 507); one a retry settles carries
// Retry-After.
var refusals = map[string]refusal{
	idemgate.ReasonKeyMissing:          {http.StatusBadRequest, "Idempotency-Key missing", retryNever},
	idemgate.ReasonKeyInvalid:          {http.StatusBadRequest, "Idempotency-Key invalid", retryNever},
	idemgate.ReasonKeyReused:           {http.StatusUnprocessableEntity, "Idempotency-Key reused with a different request", retryNever},
	idemgate.ReasonInFlight:            {http.StatusConflict, "A request with this Idempotency-Key is still being processed", retryAlways},
	idemgate.ReasonOutcomeUnknown:      {http.StatusConflict, "Outcome of an earlier attempt unknown", retryNever},
	idemgate.ReasonResultTooLarge:      {http.StatusInsufficientStorage, "Outcome too large to replay", retryNever},
	idemgate.ReasonStoreUnavailable:    {http.StatusServiceUnavailable, "Idempotency store unavailable", retryAlways},
	idemgate.ReasonQuotaExceeded:       {http.StatusTooManyRequests, "Idempotency quota exceeded", retryRate},
	idemgate.ReasonStoreRejected:       {http.StatusInternalServerError, "Idempotency store refused the request", retryNever},
	idemgate.ReasonOutcomeTypeMismatch: {http.StatusInternalServerError, "Stored outcome unreadable", retryNever},
	ReasonRequestTooLarge:              {http.StatusRequestEntityTooLarge, "Request body too large", retryNever},
	ReasonUnauthenticated:              {http.StatusUnauthorized, "Caller not identified", retryNever},
}

// StatusOf returns the HTTP status code the gate answers a refusal with
// reason: 400, 409, 422, ... as the table in the package documentation
// says, or 500 for a reason it does not know.
func StatusOf(reason string) int {
	if r, ok := refusals[reason]; ok {
		return r.status
	}
	return http.StatusInternalServerError
}

// problemOf turns a gatecore error (a gRPC status with one ErrorInfo and
// maybe RetryInfo) into its problem details.
func (g *Gate) problemOf(err error) Problem {
	reason := grpcerr.Reason(err)
	st := status.Convert(err)
	p := Problem{Reason: reason, Detail: strings.TrimPrefix(st.Message(), "idemgate: ")}
	if r, ok := refusals[reason]; ok {
		p.Status, p.Title = r.status, r.title
	} else {
		// No reason: the caller's own cancellation or deadline, mapped as
		// gRPC's HTTP mapping does.
		switch st.Code() {
		case codes.Canceled:
			p.Status, p.Title = 499, "Client closed request"
		case codes.DeadlineExceeded:
			p.Status, p.Title = http.StatusGatewayTimeout, "Request deadline exceeded"
		default:
			p.Status, p.Title = http.StatusInternalServerError, "Internal error"
		}
	}
	if d, ok := grpcerr.RetryDelay(err); ok && d > 0 {
		p.RetryAfter = retrySeconds(d)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && len(info.GetMetadata()) > 0 {
			p.Metadata = info.GetMetadata()
		}
	}
	p.Type = g.problemType(reason)
	return p
}

// problem is a refusal the gate makes itself, before any Dedupe call.
func (g *Gate) problem(reason, detail string) Problem {
	r := refusals[reason]
	return Problem{Type: g.problemType(reason), Title: r.title, Status: r.status, Detail: detail, Reason: reason}
}

func (g *Gate) problemType(reason string) string { return ProblemType(g.opts.problemBase, reason) }

// DefaultProblemTypeBase is the default of WithProblemTypeBase: the
// problem types are the sections of docs/gating.md on GitHub, one heading
// per reason (#idempotency-key-missing, ...), which say what a caller does.
const DefaultProblemTypeBase = "https://github.com/idemgate/idemgate/blob/main/docs/gating.md#"

// ProblemType returns the "type" of a refusal for reason: base plus the
// reason in lower case with dashes ("idempotency-key-missing"), or
// "about:blank" for no reason (the caller's own cancellation or deadline).
func ProblemType(base, reason string) string {
	if reason == "" {
		return "about:blank"
	}
	return base + strings.ReplaceAll(strings.ToLower(reason), "_", "-")
}

// retrySeconds rounds a retry delay up to whole seconds, at least 1, as
// Retry-After carries it.
func retrySeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

// writeProblem answers with p: application/problem+json, Retry-After when
// a retry helps, never cached.
func writeProblem(w http.ResponseWriter, p Problem, extra http.Header) {
	body, err := json.Marshal(p)
	if err != nil {
		// A Problem always marshals; keep the status if it ever does not.
		body = []byte(`{"title":"Internal error","status":500}`)
	}
	h := w.Header()
	for name, values := range extra {
		h[name] = values
	}
	h.Set("Content-Type", ProblemContentType)
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(p.RetryAfter))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// errBodyTooLarge is how readBody reports a body over the limit.
var errBodyTooLarge = errors.New("request body too large")

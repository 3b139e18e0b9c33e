package httpgate

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
)

// recorder is the ResponseWriter a gated handler writes to: it captures the
// status, the headers and the body, which reach the caller only once the
// handler returned and its outcome is settled (stored, released or marked).
// Flush is accepted and does nothing until then: a stored outcome is one
// whole response, so a gated route cannot stream. Hijack is not offered.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
	// mark is the handler's verdict (MarkFinal, ...), 0 when it set none.
	mark gatecore.Verdict
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

func (rec *recorder) Header() http.Header { return rec.header }

func (rec *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		// As net/http's ResponseWriter does: such a status cannot be sent,
		// so it must not be stored and replayed either (the panic is the
		// handler's, a lost outcome).
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if rec.wroteHeader || code < 200 {
		// A second WriteHeader is ignored, as net/http ignores it; an
		// informational status (103 Early Hints) is not the response.
		return
	}
	rec.status, rec.wroteHeader = code, true
}

func (rec *recorder) Write(p []byte) (int, error) {
	rec.WriteHeader(http.StatusOK)
	return rec.body.Write(p)
}

// Flush implements http.Flusher as a no-op: the response is sent whole
// when the handler returns.
func (rec *recorder) Flush() {}

// statusCode is what the handler answered, 200 when it wrote nothing.
func (rec *recorder) statusCode() int {
	if !rec.wroteHeader {
		return http.StatusOK
	}
	return rec.status
}

// MarkFinal marks the response being written to w as the action's final
// outcome: stored and replayed whatever its status (a 4xx or 5xx the route
// would otherwise release). It reports false, doing nothing, when w is not
// a gated request's writer (or one that wraps it with an
// Unwrap() http.ResponseWriter method).
func MarkFinal(w http.ResponseWriter) bool { return markWriter(w, gatecore.VerdictOutcome) }

// MarkRetryable marks the response being written to w as not an outcome:
// the side effect certainly did not happen, so the key is released and a
// retry runs the handler again, whatever the status (even a 2xx). It
// reports false when w is not a gated request's writer.
func MarkRetryable(w http.ResponseWriter) bool { return markWriter(w, gatecore.VerdictNotRun) }

// MarkOutcomeUnknown marks the response being written to w as leaving the
// side effect's outcome unknown (the provider timed out mid-charge). Under
// FAIL_CLOSED the record is marked outcome-unknown and this caller and its
// retries get 500 IDEMPOTENCY_OUTCOME_UNKNOWN until it is resolved; under
// REEXECUTE the key is released and this caller gets the response. It
// reports false when w is not a gated request's writer.
func MarkOutcomeUnknown(w http.ResponseWriter) bool { return markWriter(w, gatecore.VerdictUnknown) }

func markWriter(w http.ResponseWriter, v gatecore.Verdict) bool {
	for w != nil {
		if rec, ok := w.(*recorder); ok {
			rec.mark = v
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
	return false
}

// notStored are the response fields never stored nor replayed: the
// hop-by-hop ones (RFC 9110 7.6.1), which describe one connection; Date,
// which the replay's own connection sends fresh (the original's time is in
// Idempotency-Original-Time); Content-Length, set from the body; Trailer,
// as trailers are not captured; and Set-Cookie, because a cookie is a
// credential of one session that must not sit in the Dedupe store nor be
// handed out again when the session it named may be gone (the first
// caller still gets it).
var notStored = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Date": true, "Content-Length": true, "Set-Cookie": true,
}

// storedHeaders returns the handler's response header fields as stored:
// canonical names sorted, without the fields of notStored, the gate's own
// and the names that are not valid tokens (net/http would drop them).
func storedHeaders(h http.Header) []*idemgatev1.HttpHeader {
	var out []*idemgatev1.HttpHeader
	for name, values := range h {
		canonical := http.CanonicalHeaderKey(name)
		if notStored[canonical] || strings.HasPrefix(canonical, "Idempotency-") || strings.HasPrefix(name, http.TrailerPrefix) || !validName(name) || len(values) == 0 {
			continue
		}
		hh := &idemgatev1.HttpHeader{Name: canonical}
		for _, v := range values {
			hh.Values = append(hh.Values, []byte(v))
		}
		out = append(out, hh)
	}
	slices.SortFunc(out, func(a, b *idemgatev1.HttpHeader) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}

// validName reports whether name is an HTTP token (RFC 9110 5.6.2).
func validName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// answer is what the caller gets: a response (the handler's, or a stored
// one) plus the gate's own headers.
type answer struct {
	resp *idemgatev1.HttpResponse
	// gate holds the gate's headers (Idempotency-Replayed, ...).
	gate http.Header
	// cookies are the Set-Cookie values of a first execution: its caller
	// gets them, duplicates never do (they are not stored).
	cookies []string
}

// write sends a as the response: the stored status, headers and body, the
// gate's headers, and the body's own Content-Length.
func (a *answer) write(w http.ResponseWriter) {
	h := w.Header()
	for _, hh := range a.resp.GetHeaders() {
		values := make([]string, len(hh.GetValues()))
		for i, v := range hh.GetValues() {
			values[i] = string(v)
		}
		h[hh.GetName()] = values
	}
	for name, values := range a.gate {
		h[name] = values
	}
	if len(a.cookies) > 0 {
		h["Set-Cookie"] = a.cookies
	}
	body := a.resp.GetBody()
	status := int(a.resp.GetStatus())
	if status != http.StatusNoContent && status != http.StatusNotModified {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

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
	"github.com/idemgate/idemgate/internal/replayfields"
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
// retries get 409 IDEMPOTENCY_OUTCOME_UNKNOWN until it is resolved; under
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

// storedHeaders returns the handler's response header fields as stored:
// canonical names sorted, only those rule stores (not per-caller, not of
// the connection: internal/replayfields), without the gate's own and the
// names that are not valid tokens (net/http would drop them).
func storedHeaders(h http.Header, rule replayfields.Rule) []*idemgatev1.HttpHeader {
	var out []*idemgatev1.HttpHeader
	for name, values := range h {
		canonical := http.CanonicalHeaderKey(name)
		if !stored(canonical, rule) || strings.HasPrefix(name, http.TrailerPrefix) || !validName(name) || len(values) == 0 {
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

// stored reports whether a response field is stored and replayed: rule's
// verdict, less the gate's own Idempotency-* fields.
func stored(name string, rule replayfields.Rule) bool {
	return rule.Stored(name) && !strings.HasPrefix(http.CanonicalHeaderKey(name), "Idempotency-")
}

// perCaller returns the per-caller fields of a handler's response, which
// its own caller gets and no duplicate does.
func perCaller(h http.Header, rule replayfields.Rule) http.Header {
	var out http.Header
	for name, values := range h {
		if len(values) > 0 && validName(name) && rule.PerCaller(name) {
			if out == nil {
				out = http.Header{}
			}
			out[http.CanonicalHeaderKey(name)] = values
		}
	}
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
	// perCaller are the per-caller fields of a first execution (Set-Cookie,
	// ...): its caller gets them, duplicates never do (they are not stored).
	perCaller http.Header
	// rule is the gate's: a stored field it no longer stores (a record
	// written before the field became per-caller) is not replayed.
	rule replayfields.Rule
}

// write sends a as the response: the stored status, headers and body, the
// gate's headers, and the body's own Content-Length.
func (a *answer) write(w http.ResponseWriter) {
	h := w.Header()
	for _, hh := range a.resp.GetHeaders() {
		if !stored(hh.GetName(), a.rule) {
			continue
		}
		values := make([]string, len(hh.GetValues()))
		for i, v := range hh.GetValues() {
			values[i] = string(v)
		}
		h[hh.GetName()] = values
	}
	for name, values := range a.gate {
		h[name] = values
	}
	for name, values := range a.perCaller {
		h[name] = values
	}
	body := a.resp.GetBody()
	status := int(a.resp.GetStatus())
	if status != http.StatusNoContent && status != http.StatusNotModified {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

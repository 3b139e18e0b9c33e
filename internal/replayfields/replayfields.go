// Package replayfields is the one rule every gate (httpgate, connectgate,
// the gRPC interceptor) follows for which of a handler's response fields
// (HTTP header fields, gRPC metadata keys) are stored with an outcome and
// replayed to its duplicates: per-caller fields never are. The first caller
// still gets them from its own handler run; a duplicate is another caller
// (or the same one in another session), so handing it the first caller's
// credentials or per-request answers would leak them. A record written
// before a field became per-caller still replays, without that field: the
// gates apply the rule when they replay too.
package replayfields

import "strings"

// builtin are the per-caller fields every gate knows, lowercase:
// Set-Cookie and Set-Cookie2 (a cookie is a credential of one session),
// Authorization-Info and Proxy-Authentication-Info (RFC 9110 11.6.3 and
// 11.7.3: they answer one request's credentials). Every Access-Control-*
// field is per-caller too (see PerCaller).
var builtin = map[string]bool{
	"set-cookie": true, "set-cookie2": true, "authorization-info": true, "proxy-authentication-info": true,
}

// corsPrefix starts the CORS response fields: they answer one request's
// Origin (Access-Control-Allow-Origin: https://a.example with
// -Allow-Credentials: true lets that origin read the answer with the user's
// cookies), so a CORS middleware outside the gate sets them per request.
const corsPrefix = "access-control-"

// Rule says which response fields are per-caller: the built-in ones plus
// those an operator names (WithPerCallerHeaders). The zero Rule holds only
// the built-in ones. It is safe for concurrent use once made.
type Rule struct {
	extra map[string]bool
}

// New returns the Rule that holds the built-in per-caller fields and names,
// case-insensitive (a header such as X-Caller that names who asked).
func New(names ...string) Rule {
	r := Rule{}
	for _, n := range names {
		if n == "" {
			continue
		}
		if r.extra == nil {
			r.extra = map[string]bool{}
		}
		r.extra[strings.ToLower(n)] = true
	}
	return r
}

// PerCaller reports whether the response field name (any case) belongs to
// one caller: never stored, never replayed.
func (r Rule) PerCaller(name string) bool {
	lower := strings.ToLower(name)
	return builtin[lower] || strings.HasPrefix(lower, corsPrefix) || r.extra[lower]
}

// connection are the fields that describe one connection or one message's
// framing, lowercase: the hop-by-hop ones (RFC 9110 7.6.1), Date (the
// replay's connection sends it fresh; the original time is in
// Idempotency-Original-Time) and Content-Length (set from the body).
var connection = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true, "transfer-encoding": true,
	"upgrade": true, "te": true, "trailer": true, "date": true, "content-length": true,
}

// Stored reports whether a handler's response field name (any case) is
// stored and replayed by every gate: neither per-caller nor a field of
// the connection. A gate drops the fields its own protocol owns on top of
// this (Connect's content-encoding, gRPC's grpc-*).
func (r Rule) Stored(name string) bool {
	return !r.PerCaller(name) && !connection[strings.ToLower(name)]
}

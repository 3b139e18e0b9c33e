package dedupesvc

import (
	"context"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/idemgate/idemgate/internal/keys"
)

// Caller is who called the Dedupe service, as an authenticator established
// it (see dedupesvc/auth).
type Caller struct {
	// Name identifies the calling service: a SPIFFE ID, a certificate
	// subject, or a bearer token's configured name. Records are namespaced
	// by it, so one service never sees another's; a name with a control
	// character is refused.
	Name string
	// Admin allows the admin RPCs.
	Admin bool
	// Agent is the end caller a tool server named in AgentHeader, set only
	// for a caller the authenticator lets forward it (auth.Config.Forwarders);
	// empty otherwise. The Begin rate applies per (Name, Agent), so one agent
	// behind a shared tool server cannot spend its neighbours' rate; records,
	// their quotas and the waiters stay the tool server's (Name).
	Agent string
}

// AgentHeader is the metadata key (binary, so any UTF-8 name travels) in
// which a tool server's gate names the end caller, the gate's tenant, on its
// Dedupe RPCs. The service reads it only from callers allowed to forward
// (auth.Config.Forwarders) and ignores it from the others.
const AgentHeader = keys.AgentHeader

// MaxAgentBytes is the longest forwarded agent name accepted.
const MaxAgentBytes = 1024

type callerKey struct{}

// ContextWithCaller returns ctx carrying the authenticated caller.
func ContextWithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFromContext returns the authenticated caller, if any.
func CallerFromContext(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// MaxNamespaceBytes is the longest caller name (namespace) accepted.
const MaxNamespaceBytes = 1024

// namespace returns the authenticated caller's name, the namespace its
// records are kept in: a column of its own in the record's key, never a
// prefix of the scope. Without an authenticated caller (no authenticator
// installed) it is empty. A name with a control character or over
// MaxNamespaceBytes is refused: it is logged and shown to operators.
func namespace(ctx context.Context) (string, error) {
	c, _ := CallerFromContext(ctx)
	if err := checkText("namespace", "the caller's name", c.Name, MaxNamespaceBytes); err != nil {
		return "", err
	}
	return c.Name, nil
}

// checkText refuses s (the field named field, described as what) when it is
// longer than max bytes, is not UTF-8, or holds a control character (C0,
// DEL or C1): such bytes end up in logs, listings and SQL text parameters,
// where PostgreSQL refuses NUL and the embedded store would keep them.
func checkText(field, what, s string, max int) error {
	if len(s) > max {
		return invalid(field, fmt.Sprintf("%s is longer than %d bytes", what, max))
	}
	if !utf8.ValidString(s) {
		return invalid(field, what+" is not valid UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return invalid(field, fmt.Sprintf("%s holds the control character %U", what, r))
		}
	}
	return nil
}

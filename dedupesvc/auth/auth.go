// Package auth decides who calls the Dedupe service: from a verified client
// certificate (mutual TLS: the SPIFFE ID in its URI SANs, else its subject)
// or from a bearer token and the name configured for it. Never from metadata
// the caller writes about itself.
//
// Install the Authenticator's interceptor on the Dedupe server. The service
// namespaces every record by the caller's name, so one tool server can never
// replay, finish, release or resolve another's records.
package auth

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/identity"
)

// Reasons of the errors the Authenticator returns.
const (
	// ReasonUnauthenticated: no verified client certificate and no valid
	// bearer token. UNAUTHENTICATED.
	ReasonUnauthenticated = "DEDUPE_UNAUTHENTICATED"
	// ReasonPermissionDenied: the caller may not call an admin RPC.
	// PERMISSION_DENIED.
	ReasonPermissionDenied = "DEDUPE_PERMISSION_DENIED"
)

// Token is one accepted bearer token.
type Token struct {
	// Name is the caller's identity when it presents Secret.
	Name string
	// Secret is the token itself.
	Secret string
	// Admin allows the admin RPCs.
	Admin bool
}

// Config configures an Authenticator. The zero value accepts nobody.
type Config struct {
	// Tokens are the accepted bearer tokens. Defaults to none.
	Tokens []Token
	// AdminIdentities are the certificate identities (SPIFFE IDs or
	// subjects) allowed the admin RPCs. Defaults to none.
	AdminIdentities []string
	// AdminMethodPrefix marks the admin RPCs by full method name prefix.
	// Defaults to "/idemgate.v1.AdminService/".
	AdminMethodPrefix string
	// Anonymous, when not empty, is the identity of callers that present
	// nothing: for a development set-up on loopback only. Defaults to empty:
	// such callers get UNAUTHENTICATED.
	Anonymous string
	// Forwarders are the identities (token names, SPIFFE IDs or subjects)
	// whose forwarded end caller (dedupesvc.AgentHeader, which a gate sends
	// with its tenant) the service takes: their Begin rate then applies per
	// agent (dedupesvc.Caller.Agent). The header is ignored from any other
	// caller. List only tool servers you trust to name their agents
	// truthfully: a forwarder may spread its calls over as many agents as it
	// names. Defaults to none.
	Forwarders []string
	// AdminMethods are further full method names reserved to admins, such as
	// "/idemgate.v1.DedupeService/Resolve". Defaults to none.
	AdminMethods []string
	// Logger gets a warning line per refused call (reason, method, peer;
	// never the presented secret), at most LogRate a second. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// LogRate is how many refusal lines a second are logged, in bursts of
	// LogBurst; the lines left out are counted in the next one, and every
	// refusal in the metrics. Defaults to 1.
	LogRate float64
}

// LogBurst is how many refusal lines may be logged at once before LogRate
// applies.
const LogBurst = 10

// Refusal reasons, the values of the reason label of
// idemgate_dedupe_auth_refusals_total.
const (
	// RefusalMissingCredentials: no verified client certificate and no
	// authorization header.
	RefusalMissingCredentials = "missing_credentials"
	// RefusalInvalidToken: an authorization header that is not an accepted
	// bearer token.
	RefusalInvalidToken = "invalid_token"
	// RefusalNotAdmin: an admin RPC from a caller without the admin right.
	RefusalNotAdmin = "not_admin"
	// RefusalInvalidAgent: a forwarder (Config.Forwarders) named an agent
	// that is not UTF-8, holds a control character or is too long.
	RefusalInvalidAgent = "invalid_agent"
)

// Authenticator establishes the caller of each call. It is also a
// prometheus.Collector of idemgate_dedupe_auth_refusals_total{reason}.
type Authenticator struct {
	cfg        Config
	admins     map[string]bool
	forwarders map[string]bool
	tokens     atomic.Pointer[[]Token]

	refusals   *prometheus.CounterVec
	logLimit   *rate.Limiter
	suppressed atomic.Int64
}

var _ prometheus.Collector = (*Authenticator)(nil)

// New validates cfg and returns its Authenticator.
func New(cfg Config) (*Authenticator, error) {
	if cfg.AdminMethodPrefix == "" {
		cfg.AdminMethodPrefix = "/idemgate.v1.AdminService/"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LogRate <= 0 {
		cfg.LogRate = 1
	}
	var errs []error
	if err := validTokens(cfg.Tokens); err != nil {
		errs = append(errs, err)
	}
	if cfg.Anonymous != "" {
		if err := validName(cfg.Anonymous); err != nil {
			errs = append(errs, fmt.Errorf("anonymous identity %w", err))
		}
	}
	a := &Authenticator{cfg: cfg, admins: map[string]bool{}, forwarders: map[string]bool{},
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_dedupe_auth_refusals_total",
			Help: "Calls refused by authentication, by reason: missing_credentials, invalid_token, not_admin, invalid_agent.",
		}, []string{"reason"}),
		logLimit: rate.NewLimiter(rate.Limit(cfg.LogRate), LogBurst),
	}
	for _, reason := range []string{RefusalMissingCredentials, RefusalInvalidToken, RefusalNotAdmin, RefusalInvalidAgent} {
		a.refusals.WithLabelValues(reason)
	}
	tokens := slices.Clone(cfg.Tokens)
	a.tokens.Store(&tokens)
	for _, id := range cfg.AdminIdentities {
		a.admins[id] = true
	}
	for _, id := range cfg.Forwarders {
		a.forwarders[id] = true
	}
	return a, errors.Join(errs...)
}

// SetTokens replaces the accepted bearer tokens, as when the token file
// changed: a removed token is refused from the next call on. Invalid tokens
// leave the ones in force unchanged.
func (a *Authenticator) SetTokens(tokens []Token) error {
	if err := validTokens(tokens); err != nil {
		return err
	}
	tokens = slices.Clone(tokens)
	a.tokens.Store(&tokens)
	return nil
}

func validTokens(tokens []Token) error {
	var errs []error
	seen := map[string]bool{}
	for i, t := range tokens {
		if err := validName(t.Name); err != nil {
			errs = append(errs, fmt.Errorf("token %d: name %w", i+1, err))
		}
		if len(t.Secret) < 16 {
			errs = append(errs, fmt.Errorf("token %d (%s): the secret must be at least 16 characters", i+1, t.Name))
		}
		if seen[t.Secret] {
			errs = append(errs, fmt.Errorf("token %d (%s): the same secret is given twice", i+1, t.Name))
		}
		seen[t.Secret] = true
	}
	return errors.Join(errs...)
}

// Describe implements prometheus.Collector.
func (a *Authenticator) Describe(ch chan<- *prometheus.Desc) { a.refusals.Describe(ch) }

// Collect implements prometheus.Collector.
func (a *Authenticator) Collect(ch chan<- prometheus.Metric) { a.refusals.Collect(ch) }

// refused counts a refusal and logs it unless the log is over its rate, so a
// flood of bad calls is visible without flooding the log. The presented
// secret is never logged.
func (a *Authenticator) refused(ctx context.Context, method, reason, caller string, err error) error {
	a.refusals.WithLabelValues(reason).Inc()
	if !a.logLimit.Allow() {
		a.suppressed.Add(1)
		return err
	}
	attrs := []any{slog.String("reason", reason), slog.String("method", method)}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		attrs = append(attrs, slog.String("peer", p.Addr.String()))
	}
	if caller != "" {
		attrs = append(attrs, slog.String("caller", caller))
	}
	if n := a.suppressed.Swap(0); n > 0 {
		attrs = append(attrs, slog.Int64("suppressed", n))
	}
	a.cfg.Logger.WarnContext(ctx, "authentication refused", attrs...)
	return err
}

// adminOnly reports whether method is reserved to admins.
func (a *Authenticator) adminOnly(method string) bool {
	return strings.HasPrefix(method, a.cfg.AdminMethodPrefix) || slices.Contains(a.cfg.AdminMethods, method)
}

// validName refuses names that could blur the record namespace.
func validName(name string) error {
	switch {
	case name == "":
		return errors.New("is empty")
	case len(name) > 256:
		return errors.New("is longer than 256 bytes")
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return errors.New("has a control character")
		}
	}
	return nil
}

// UnaryServerInterceptor returns the interceptor that authenticates every
// call, refuses admin RPCs to non-admins, and puts the caller in the context
// (dedupesvc.CallerFromContext). Health checks are not authenticated, so
// probes work without credentials.
func (a *Authenticator) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, "/grpc.health.v1.Health/") {
			return handler(ctx, req)
		}
		caller, reason, err := a.authenticate(ctx)
		if err != nil {
			return nil, a.refused(ctx, info.FullMethod, reason, "", err)
		}
		if a.adminOnly(info.FullMethod) && !caller.Admin {
			return nil, a.refused(ctx, info.FullMethod, RefusalNotAdmin, caller.Name, grpcerr.New(codes.PermissionDenied, ReasonPermissionDenied,
				fmt.Sprintf("%s is reserved to admins on this service and %q has no admin right", info.FullMethod, caller.Name), nil, 0))
		}
		return handler(dedupesvc.ContextWithCaller(ctx, caller), req)
	}
}

// StreamServerInterceptor authenticates streams (server reflection, when it
// is on) the same way; the health service's Watch stays open to probes.
func (a *Authenticator) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if strings.HasPrefix(info.FullMethod, "/grpc.health.v1.Health/") {
			return handler(srv, ss)
		}
		caller, reason, err := a.authenticate(ss.Context())
		if err != nil {
			return a.refused(ss.Context(), info.FullMethod, reason, "", err)
		}
		if a.adminOnly(info.FullMethod) && !caller.Admin {
			return a.refused(ss.Context(), info.FullMethod, RefusalNotAdmin, caller.Name, grpcerr.New(codes.PermissionDenied, ReasonPermissionDenied,
				fmt.Sprintf("%s is reserved to admins on this service and %q has no admin right", info.FullMethod, caller.Name), nil, 0))
		}
		return handler(srv, ss)
	}
}

// Admit decides, before grpc-go creates a stream and reads any of its
// message, whether the stream may start: ctx is a tap handle's
// (grpc.InTapHandle), carrying the headers and the connection's peer. A
// caller with a verified client certificate or a valid bearer token is
// admitted, authenticated reporting true; a health check without
// credentials is admitted unauthenticated, so probes work; any other call
// without valid credentials is refused, counted and logged as the
// interceptors refuse it, so a stranger's request costs no more than its
// headers. The interceptors still run: they check admin rights and put the
// caller in the context.
func (a *Authenticator) Admit(ctx context.Context, method string) (authenticated bool, err error) {
	_, reason, err := a.authenticate(ctx)
	switch {
	case err == nil:
		return true, nil
	case strings.HasPrefix(method, "/grpc.health.v1.Health/"):
		return false, nil
	default:
		return false, a.refused(ctx, method, reason, "", err)
	}
}

// Authenticate returns the caller of ctx's call, or UNAUTHENTICATED. It
// neither counts nor logs a refusal; the interceptors do.
func (a *Authenticator) Authenticate(ctx context.Context) (dedupesvc.Caller, error) {
	caller, _, err := a.authenticate(ctx)
	return caller, err
}

// authenticate is Authenticate with the refusal reason.
func (a *Authenticator) authenticate(ctx context.Context) (dedupesvc.Caller, string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if name := identity.FromPeer(ctx); name != "" {
		return a.withAgent(dedupesvc.Caller{Name: name, Admin: a.admins[name]}, md)
	}
	if values := md.Get("authorization"); len(values) > 0 {
		secret, ok := strings.CutPrefix(values[0], "Bearer ")
		if ok {
			for _, t := range *a.tokens.Load() {
				if subtle.ConstantTimeCompare([]byte(secret), []byte(t.Secret)) == 1 {
					return a.withAgent(dedupesvc.Caller{Name: t.Name, Admin: t.Admin}, md)
				}
			}
		}
		return dedupesvc.Caller{}, RefusalInvalidToken, grpcerr.New(codes.Unauthenticated, ReasonUnauthenticated,
			"the bearer token is not valid for this dedupe service", nil, 0)
	}
	if a.cfg.Anonymous != "" {
		return dedupesvc.Caller{Name: a.cfg.Anonymous}, "", nil
	}
	return dedupesvc.Caller{}, RefusalMissingCredentials, grpcerr.New(codes.Unauthenticated, ReasonUnauthenticated,
		"the dedupe service needs a client certificate or an \"authorization: Bearer <token>\" header", nil, 0)
}

// withAgent adds the agent a forwarder names in md to c; from a caller that
// is not a forwarder the header is ignored. A forwarded name that could blur
// logs or limits (not UTF-8, a control character, too long) is refused.
func (a *Authenticator) withAgent(c dedupesvc.Caller, md metadata.MD) (dedupesvc.Caller, string, error) {
	if !a.forwarders[c.Name] {
		return c, "", nil
	}
	values := md.Get(dedupesvc.AgentHeader)
	if len(values) == 0 || values[0] == "" {
		return c, "", nil
	}
	agent := values[0]
	if len(agent) > dedupesvc.MaxAgentBytes || !utf8.ValidString(agent) || strings.ContainsFunc(agent, unicode.IsControl) {
		return dedupesvc.Caller{}, RefusalInvalidAgent, grpcerr.New(codes.InvalidArgument, dedupesvc.ReasonInvalidRequest,
			fmt.Sprintf("the forwarded agent (%s) must be UTF-8 without control characters, at most %d bytes", dedupesvc.AgentHeader, dedupesvc.MaxAgentBytes),
			map[string]string{"field": dedupesvc.AgentHeader}, 0)
	}
	c.Agent = agent
	return c, "", nil
}

// ReadTokens parses a token file: one token a line, "name role secret",
// role being "client" or "admin"; blank lines and lines starting with # are
// skipped.
func ReadTokens(r io.Reader) ([]Token, error) {
	var (
		tokens []Token
		line   int
	)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) != 3 || (fields[1] != "client" && fields[1] != "admin") {
			return nil, fmt.Errorf("token file line %d: want \"name client|admin secret\"", line)
		}
		tokens = append(tokens, Token{Name: fields[0], Admin: fields[1] == "admin", Secret: fields[2]})
	}
	return tokens, sc.Err()
}

// BearerToken returns per-RPC credentials that send token as
// "authorization: Bearer <token>". Over plaintext only when insecure is set
// (loopback development).
func BearerToken(token string, insecure bool) credentials.PerRPCCredentials {
	return bearer{token: token, insecure: insecure}
}

type bearer struct {
	token    string
	insecure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return !b.insecure }

package mcpgate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/keys"
	"github.com/idemgate/idemgate/internal/mcpwire"
)

// The wire names, shared with the idemgate MCP bridge.
const (
	// MetaKey is the _meta member of a tools/call request that carries the
	// idempotency key.
	MetaKey = mcpwire.MetaKey
	// MetaReplayed is the _meta member of a gated tool's result: true when
	// it is the stored outcome of an earlier call with the key, false on the
	// run that stored it.
	MetaReplayed = mcpwire.MetaReplayed
	// MetaKeyDerived is the _meta member set to true when a keyless call was
	// deduplicated on its fingerprint (ToolPolicy.KeylessFingerprint).
	MetaKeyDerived = mcpwire.MetaKeyDerived
	// MetaError is the _meta member of a refusal: code, reason, domain,
	// metadata, message, retryAfterSeconds and advice.
	MetaError = mcpwire.MetaError
	// ParamKey is SEP-3182's tools/call parameter carrying the key.
	ParamKey = mcpwire.ParamKey
	// CapabilityName names the idempotency capability the gate advertises
	// on the initialize and the server/discover results, with the settings
	// {"metaKey": MetaKey, "param": ParamKey}: in capabilities.experimental
	// (clients before 2026-07-28) and as the extension identifier in
	// capabilities.extensions (2026-07-28), next to SEP-3182's
	// capabilities.tools.idempotency.
	CapabilityName = mcpwire.CapabilityName
	// SchemaKey marks, in a tool's input schema, the property that carries
	// the idempotency key: "io.idemgate/idempotency-key": true.
	SchemaKey = "io.idemgate/idempotency-key"
	// SchemaExclude marks, in a tool's input schema, a property left out of
	// the fingerprint: "io.idemgate/exclude-from-fingerprint": true.
	SchemaExclude = "io.idemgate/exclude-from-fingerprint"
)

// The reasons of the refusals only MCP has, in _meta[MetaError].reason;
// every other refusal carries one of package idemgate's reasons
// (idemgate.ReasonKeyMissing and the rest), the same as the other gates'.
const (
	// ReasonArgumentsInvalid: the arguments are not a JSON object.
	ReasonArgumentsInvalid = mcpwire.ReasonArgumentsInvalid
	// ReasonArgumentsTooLarge: the arguments are over WithMaxArgumentBytes
	// (INVALID_ARGUMENT); the tool did not run.
	ReasonArgumentsTooLarge = mcpwire.ReasonArgumentsTooLarge
	// ReasonUnauthenticated: a call over HTTP has no authenticated identity
	// to name its tenant by, and the gate is not WithSingleTenant
	// (UNAUTHENTICATED); the tool did not run.
	ReasonUnauthenticated = mcpwire.ReasonUnauthenticated
	// ReasonAnswerBudgetExhausted: over streamable HTTP (HTTPHandler,
	// HTTPMiddleware), the answers being written held 256 MiB, or 32 MiB for
	// the caller's address (callers that do not read them), so the tool's
	// result was not held (RESOURCE_EXHAUSTED with RetryInfo). The tool ran:
	// a retry with the same key replays a gated tool's stored result.
	ReasonAnswerBudgetExhausted = mcpwire.ReasonAnswerBudgetExhausted
	// ReasonAnswerTooLarge: over streamable HTTP, the tool's result is
	// larger than one caller's share of the answer budget (32 MiB), so it is
	// never sent (RESOURCE_EXHAUSTED). The tool ran.
	ReasonAnswerTooLarge = mcpwire.ReasonAnswerTooLarge
)

// A gated tool's context can end with (context.Cause) idemgate.ErrFenced (the
// attempt lost its reservation; its result will be refused) or
// idemgate.ErrExecutionTimeout (it ran past its ExecutionTimeout).

// Policy defaults, the gRPC interceptor's.
const (
	// DefaultRetention is how long an outcome is replayed: 24h.
	DefaultRetention = gatecore.DefaultRetention
	// DefaultLease is how long a reservation is held without a heartbeat:
	// 10s.
	DefaultLease = gatecore.DefaultLease
	// DefaultMaxWait is how long a duplicate waits for an in-flight
	// original: 3s.
	DefaultMaxWait = gatecore.DefaultMaxWait
	// DefaultExecutionTimeout bounds a tool's run: 60s.
	DefaultExecutionTimeout = gatecore.DefaultExecutionTimeout
	// DefaultKeylessWindow is how long identical keyless calls collapse into
	// one under KeylessFingerprint: 60s.
	DefaultKeylessWindow = gatecore.DefaultKeylessWindow
)

// Gate gates the tools/call requests of one MCP server. It is safe for
// concurrent use.
type Gate struct {
	engine  *gatecore.Engine
	opts    options
	metrics *metrics
	// dedupe is the engine's Dedupe client, observed: CheckDedupe's and
	// WatchDedupe's.
	dedupe *gatecore.Observer
	// tools caches each tool's resolved policy by name, valid while the
	// server lists the same *mcp.Tool under it.
	mu    sync.Mutex
	tools map[string]*resolved
}

// resolved is one tool's policy, as of one *mcp.Tool.
type resolved struct {
	tool *mcp.Tool
	// listed is the tool as tools/list shows it: tool, or a copy with the
	// added key argument.
	listed *mcp.Tool
	// added is the added key argument's name, or "".
	added string
	// sig is the tool's JSON as resolved: a tool re-added under the same
	// pointer with other annotations or schema is resolved again.
	sig          []byte
	gated        bool
	unclassified bool
	policy       ToolPolicy
	keyArgs      map[string]bool
	exclude      map[string]bool
	err          error
}

// New lists server's tools, resolves which are gated, and adds the gate's
// middleware to server's receiving middleware (middleware added before New
// runs inside the gate, after New outside it). Call it after adding the
// tools; tools added later are resolved on their first call. New fails,
// naming each tool, when a tool named gated with WithTool is annotated
// read-only, a policy is out of range, or (WithStrict) a tool is neither
// named nor annotated.
func New(ctx context.Context, dedupe idemgatev1.DedupeServiceClient, server *mcp.Server, opts ...Option) (*Gate, error) {
	if dedupe == nil || server == nil {
		return nil, errors.New("mcpgate: New needs a Dedupe service client and a server")
	}
	o := defaultOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.tenant == nil {
		return nil, errors.New("mcpgate: WithTenant needs a tenant function (TokenTenant is the default); it was given nil")
	}
	if o.maxArgs <= 0 {
		return nil, fmt.Errorf("mcpgate: WithMaxArgumentBytes must be positive; it was given %d", o.maxArgs)
	}
	name, tools, err := listServer(ctx, server)
	if err != nil {
		return nil, fmt.Errorf("mcpgate: list the server's tools: %w", err)
	}
	if o.serverName == "" {
		o.serverName = name
	}
	if o.serverName == "" || !keys.Printable(o.serverName) || strings.Contains(o.serverName, "|") || len(o.serverName) > 100 {
		return nil, fmt.Errorf("mcpgate: server name %q must be 1 to 100 bytes of printable ASCII without \"|\" (WithServerName)", o.serverName)
	}
	g := &Gate{opts: o, tools: map[string]*resolved{}}
	var problems []string
	for _, t := range tools {
		r := g.resolve(t)
		g.tools[t.Name] = r
		switch {
		case r.err != nil:
			problems = append(problems, r.err.Error())
		case r.unclassified && o.strict:
			problems = append(problems, fmt.Sprintf("tool %q is neither annotated (readOnlyHint, idempotentHint) nor named with WithTool", t.Name))
		}
	}
	for name, p := range o.tools {
		if err := checkPolicy(name, p); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return nil, fmt.Errorf("mcpgate: %s", strings.Join(problems, "; "))
	}
	if g.metrics, err = newMetrics(o.registerer); err != nil {
		return nil, err
	}
	g.dedupe = gatecore.NewObserver(dedupe, o.dedupeConn, o.logger, o.dedupeLogEvery)
	g.engine = gatecore.New(g.dedupe, gatecore.Options{
		ReplayCache: gatecore.NewReplayCache(o.replayEntries, o.replayBytes, o.replayTTL),
		Logger:      o.logger, DedupeTimeout: o.dedupeTimeout, OutcomeTimeout: o.outcomeTimeout, FinishBudget: o.finishBudget,
		InFlightRetry: o.inFlightRetry, StoreRetry: o.storeRetry, MaxOutcome: o.maxOutcome, OnEvent: g.metrics.event, OnStage: g.metrics.stage,
	})
	// Over streamable HTTP every tools/call result is held within the
	// answer budget until it is written (mcpwire.HoldAnswers).
	server.AddReceivingMiddleware(mcpwire.AdvertiseIdempotency, mcpwire.HoldAnswers, mcpwire.MarkComplete, g.middleware)
	return g, nil
}

// listServer connects to server in memory and lists its name and tools.
func listServer(ctx context.Context, server *mcp.Server) (string, []*mcp.Tool, error) {
	ct, st := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, st, nil)
	if err != nil {
		return "", nil, err
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "mcpgate", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		return "", nil, err
	}
	defer cs.Close()
	var tools []*mcp.Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return "", nil, err
		}
		tools = append(tools, t)
	}
	name := ""
	if info := cs.InitializeResult().ServerInfo; info != nil {
		name = info.Name
	}
	return name, tools, nil
}

func checkPolicy(name string, p ToolPolicy) error {
	if p.NotGated {
		return nil
	}
	if err := durationsOf(p).Check(); err != nil {
		return fmt.Errorf("tool %q: %w", name, err)
	}
	return nil
}

// durationsOf is p's durations, as the core checks and defaults them.
func durationsOf(p ToolPolicy) gatecore.Durations {
	return gatecore.Durations{Retention: p.Retention, Lease: p.Lease, MaxWait: p.MaxWait, ExecutionTimeout: p.ExecutionTimeout,
		KeylessWindow: p.KeylessWindow, Keyless: p.KeylessFingerprint, NoWait: p.NoWait}
}

// withDefaults is p with the core's default for every zero field.
func withDefaults(p ToolPolicy) ToolPolicy {
	d := durationsOf(p).WithDefaults()
	p.Retention, p.Lease, p.MaxWait, p.ExecutionTimeout, p.KeylessWindow = d.Retention, d.Lease, d.MaxWait, d.ExecutionTimeout, d.KeylessWindow
	if p.OnLostOutcome == idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_UNSPECIFIED {
		p.OnLostOutcome = idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_FAIL_CLOSED
	}
	return p
}

// resolve classifies a tool: a policy named with WithTool decides; else
// readOnlyHint or idempotentHint true is not gated, and anything else
// (MCP's defaults) is.
func (g *Gate) resolve(t *mcp.Tool) *resolved {
	r := &resolved{tool: t, listed: t, sig: toolSig(t)}
	p, named := g.opts.tools[t.Name]
	a := t.Annotations
	switch {
	case named && p.NotGated:
		return r
	case named:
		if a != nil && a.ReadOnlyHint {
			r.err = fmt.Errorf("tool %q is named gated with WithTool but annotated readOnlyHint: a read-only tool is never gated; fix one of them", t.Name)
			return r
		}
	case a == nil:
		r.unclassified = true
	case a.ReadOnlyHint || a.IdempotentHint:
		return r
	}
	r.gated = true
	r.policy = withDefaults(p)
	r.keyArgs, r.exclude = map[string]bool{}, map[string]bool{}
	if p.KeyArgument != "" {
		r.keyArgs[p.KeyArgument] = true
	}
	for _, e := range p.ExcludeArguments {
		r.exclude[e] = true
	}
	schemaMarks(t.InputSchema, r.keyArgs, r.exclude)
	r.added = p.AddKeyArgument
	switch {
	case r.added != "" && len(r.keyArgs) > 0:
		// Two arguments for one key invite a model to fill them differently.
		r.err = fmt.Errorf("tool %q: AddKeyArgument %q, but the tool already has the key argument %s: the model fills that one; drop AddKeyArgument",
			t.Name, r.added, strings.Join(r.keyArgNames(), ", "))
		return r
	case r.added == "" && len(r.keyArgs) == 0:
		// WithKeyArgument is for the tools without a key argument of their own.
		r.added = g.opts.keyArgument
	}
	if r.added != "" {
		if r.exclude[r.added] {
			r.err = fmt.Errorf("tool %q: the added key argument %q is also excluded from the fingerprint", t.Name, r.added)
			return r
		}
		schema, err := mcpwire.WithKeyArgument(t.InputSchema, r.added)
		if err != nil {
			r.err = fmt.Errorf("tool %q: adding the key argument: %w", t.Name, err)
			return r
		}
		listed := *t
		listed.InputSchema = schema
		listed.Description = strings.TrimSpace(t.Description + "\n\nRuns once per idempotency key: send the key as the argument " +
			r.added + ", one value per action, and the same value again when you retry or repeat that action.")
		r.listed, r.keyArgs[r.added] = &listed, true
	}
	return r
}

// toolSig is what the gate's view of a tool depends on, as JSON (nil when
// it does not encode: then it is resolved on every call).
func toolSig(t *mcp.Tool) []byte {
	b, err := json.Marshal(t)
	if err != nil {
		return nil
	}
	return b
}

// current reports whether r is the resolution of t as it is now: the same
// tool, unchanged since (the SDK keeps the pointer a server adds, so a tool
// changed and added again is the same pointer).
func (r *resolved) current(t *mcp.Tool) bool {
	return r.tool == t && r.sig != nil && bytes.Equal(r.sig, toolSig(t))
}

// schemaMarks reads the top-level properties of an input schema marked as
// the key or excluded from the fingerprint.
func schemaMarks(schema any, keyArgs, exclude map[string]bool) {
	b, err := json.Marshal(schema)
	if err != nil {
		return
	}
	var s struct {
		Properties map[string]map[string]any `json:"properties"`
	}
	if json.Unmarshal(b, &s) != nil {
		return
	}
	for name, prop := range s.Properties {
		if v, _ := prop[SchemaKey].(bool); v {
			keyArgs[name] = true
		}
		if v, _ := prop[SchemaExclude].(bool); v {
			exclude[name] = true
		}
	}
}

// Close waits until every outcome still retried in the background is
// stored or given up; when ctx ends first it stops them and returns ctx's
// error. Call it after the server stopped.
func (g *Gate) Close(ctx context.Context) error { return g.engine.Close(ctx) }

// Stats is what the gate did that no caller saw (the interceptor's Stats).
type Stats = gatecore.Stats

// Stats returns the counters since New.
func (g *Gate) Stats() Stats { return g.engine.Stats() }

// KeyReader wraps an MCP server's stdin (the Reader of an mcp.IOTransport)
// so that SEP-3182's idempotencyKey parameter of a tools/call reaches the
// gate; every other message passes through unchanged. Closing it closes r
// when r is an io.Closer, as the SDK does when the session ends.
func KeyReader(r io.Reader) io.ReadCloser { return mcpwire.KeyReader(r) }

// HTTPMiddleware wraps a streamable HTTP MCP handler
// (mcp.NewStreamableHTTPHandler) so that SEP-3182's idempotencyKey parameter
// of a tools/call reaches the gate. It reads each POST's body: one over
// 4 MiB, the SDK's DefaultMaxRequestBodyBytes, gets 413, before it is read
// when its Content-Length says so (WithMaxBodyBytes sets another limit, for
// a handler with another MaxRequestBodyBytes); past 256 MiB of bodies held
// at once (32 MiB for one client address; WithMaxBufferedBytes), a body
// gets 503 with Retry-After. The tools/call results a gated server answers
// to a request are held until its response is written, at most 256 MiB at
// once (32 MiB for one client address; WithMaxAnswerBytes): a result past
// it is not held, and the call is answered ReasonAnswerBudgetExhausted. The
// answer budget needs a stateless handler (StreamableHTTPOptions.Stateless):
// a stateful session's calls run on the context of the request that opened
// it, unbudgeted. Limits that cannot work panic.
func HTTPMiddleware(next http.Handler, opts ...HTTPOption) http.Handler {
	return mcpwire.HTTPMiddleware(next, httpLimits(opts))
}

// middleware gates tools/call (mcpwire.AdvertiseIdempotency, outside it,
// advertises the capability).
func (g *Gate) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "tools/list":
			res, err := next(ctx, method, req)
			if list, ok := res.(*mcp.ListToolsResult); ok && err == nil {
				return g.listed(list), nil
			}
			return res, err
		case "tools/call":
		default:
			return next(ctx, method, req)
		}
		call, ok := req.(*mcp.CallToolRequest)
		if !ok || call.Params == nil {
			return next(ctx, method, req)
		}
		r, err := g.lookup(ctx, next, call)
		if err != nil {
			// Whether the tool is gated is unknown: it must not run ungated.
			g.opts.logger.ErrorContext(ctx, "mcpgate: cannot list the tools to classify a call; refused, nothing ran",
				slog.String("tool", call.Params.Name), slog.Any("error", err))
			return mcpwire.ErrorResult(grpcerr.New(codes.Internal, idemgate.ReasonStoreRejected,
				fmt.Sprintf("mcpgate: cannot list the tools to tell whether %q is gated; nothing ran", call.Params.Name), nil, 0)), nil
		}
		if r == nil {
			return next(ctx, method, req) // the SDK answers an unknown tool
		}
		if r.err != nil {
			return mcpwire.ErrorResult(grpcerr.New(codes.Internal, idemgate.ReasonStoreRejected, "mcpgate: "+r.err.Error(), nil, 0)), nil
		}
		if r.unclassified && g.opts.strict {
			return mcpwire.ErrorResult(grpcerr.New(codes.Internal, idemgate.ReasonStoreRejected,
				fmt.Sprintf("mcpgate: tool %q is neither annotated nor named with WithTool, and the gate is strict; nothing ran", r.tool.Name), nil, 0)), nil
		}
		if !r.gated {
			return next(ctx, method, req)
		}
		res, err := g.gate(ctx, next, call, r)
		g.metrics.call(r.tool.Name, res, err)
		return res, err
	}
}

// listed is a tools/list result as the gate shows it: each gated tool with
// an added key argument in its schema.
func (g *Gate) listed(list *mcp.ListToolsResult) *mcp.ListToolsResult {
	var out *mcp.ListToolsResult
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, t := range list.Tools {
		r, ok := g.tools[t.Name]
		if !ok || !r.current(t) {
			r = g.resolve(t)
			g.tools[t.Name] = r
		}
		if r.listed == t {
			continue
		}
		if out == nil {
			copied := *list
			copied.Tools = append([]*mcp.Tool(nil), list.Tools...)
			out = &copied
		}
		out.Tools[i] = r.listed
	}
	if out == nil {
		return list
	}
	return out
}

// lookup returns the tool's resolved policy, as the server lists it now
// (through the handlers inside the gate); a tool not listed now keeps the
// last policy resolved under its name, and nil means no tool of the name
// was ever listed.
func (g *Gate) lookup(ctx context.Context, next mcp.MethodHandler, call *mcp.CallToolRequest) (*resolved, error) {
	name := call.Params.Name
	cursor := ""
	for {
		res, err := next(ctx, "tools/list", &mcp.ListToolsRequest{Session: call.Session, Params: &mcp.ListToolsParams{Cursor: cursor}, Extra: call.Extra})
		if err != nil {
			return nil, err
		}
		list, ok := res.(*mcp.ListToolsResult)
		if !ok {
			return nil, fmt.Errorf("tools/list answered %T", res)
		}
		for _, t := range list.Tools {
			if t.Name != name {
				continue
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			if r, ok := g.tools[name]; ok && r.current(t) {
				return r, nil
			}
			r := g.resolve(t)
			g.tools[name] = r
			return r, nil
		}
		if list.NextCursor == "" {
			// Not listed for this request (a middleware inside the gate may
			// filter the list): the last classification under the name, or
			// none, and the SDK answers an unknown tool.
			g.mu.Lock()
			defer g.mu.Unlock()
			return g.tools[name], nil
		}
		cursor = list.NextCursor
	}
}

// derivedKeyPrefix starts every key derived from a keyless call's
// fingerprint, as the interceptor's do.
const derivedKeyPrefix = "derived:"

// toolCall is one gated tools/call as the core runs it (gatecore.Transport).
type toolCall struct {
	g       *Gate
	next    mcp.MethodHandler
	req     *mcp.CallToolRequest
	r       *resolved
	derived bool
}

// passthrough is the tool's own answer when it is not an outcome (its
// protocol error, a result that asks for input, an error result not
// replayed): handed back as the tool gave it.
type passthrough struct {
	res mcp.Result
	err error
}

// gate runs one gated tools/call.
func (g *Gate) gate(ctx context.Context, next mcp.MethodHandler, call *mcp.CallToolRequest, r *resolved) (mcp.Result, error) {
	arrived := time.Now()
	// The cheap checks first: size, key, tenant; the fingerprint, which
	// reads every byte of the arguments, last.
	if n := len(call.Params.Arguments); n > g.opts.maxArgs {
		return mcpwire.ErrorResult(grpcerr.New(codes.InvalidArgument, ReasonArgumentsTooLarge,
			fmt.Sprintf("the arguments are %d bytes, over this server's limit of %d; nothing ran", n, g.opts.maxArgs),
			map[string]string{"limit": fmt.Sprint(g.opts.maxArgs)}, 0)), nil
	}
	args, err := arguments(call.Params.Arguments)
	if err != nil {
		return mcpwire.ErrorResult(err), nil
	}
	key, hasKey, err := g.keyOf(call, r, args)
	if err != nil {
		return mcpwire.ErrorResult(err), nil
	}
	p := r.policy
	if !hasKey && !p.KeylessFingerprint {
		return mcpwire.ErrorResult(grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyMissing,
			mcpwire.KeyMissingMessage(r.keyArgNames()...), nil, 0)), nil
	}
	tenant, err := g.opts.tenant(ctx, call)
	if err != nil {
		if _, ok := status.FromError(err); !ok {
			err = status.Error(codes.Unauthenticated, err.Error())
		}
		return mcpwire.ErrorResult(err), nil
	}
	if tenant == DefaultTenant && call.Extra != nil && call.Extra.Header != nil && !g.opts.singleTenant {
		// Over HTTP, callers without an identity are anyone who can reach
		// the server: in one tenant, one would be replayed another's result.
		return mcpwire.ErrorResult(grpcerr.New(codes.Unauthenticated, ReasonUnauthenticated,
			"this gated tool needs an authenticated caller (a bearer token naming a user): over HTTP, callers without one would share one tenant and see one another's results; nothing ran",
			nil, 0)), nil
	}
	fingerprint, err := Fingerprint(args, r.keyArgs, r.exclude)
	if err != nil {
		return mcpwire.ErrorResult(grpcerr.New(codes.InvalidArgument, ReasonArgumentsInvalid, "the arguments are not canonical JSON: "+err.Error(), nil, 0)), nil
	}
	if r.added != "" {
		// The tool never sees the argument the gate added.
		argKey, hasArg, rest, err := mcpwire.TakeArgument(call.Params.Arguments, r.added)
		if err != nil {
			return mcpwire.ErrorResult(err), nil
		}
		// The SDK checks the x-mcp-header mirror only for the schemas it
		// registered; the added argument is the gate's, so the gate checks
		// it: a proxy that read the header saw the key the gate uses.
		if call.Extra != nil && hasArg {
			if h, ok := mcpwire.HeaderValue(call.Extra.Header.Get("Mcp-Param-" + mcpwire.KeyHeaderName)); ok && h != argKey {
				return mcpwire.ErrorResult(grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyConflict,
					fmt.Sprintf("the Mcp-Param-%s header and the argument %s carry different idempotency keys", mcpwire.KeyHeaderName, r.added),
					map[string]string{"field": r.added}, 0)), nil
			}
		}
		params := *call.Params
		params.Arguments = rest
		stripped := *call
		stripped.Params = &params
		call = &stripped
	}
	retention := p.Retention
	derived := false
	if !hasKey {
		key, retention, derived = derivedKeyPrefix+hex.EncodeToString(fingerprint), p.KeylessWindow, true
	}
	scope := "mcp/" + g.opts.serverName + "/" + r.tool.Name
	if tenant != "" {
		scope += "|" + tenant
	}
	c := gatecore.NewCall(r.tool.Name, scope, key, fingerprint, gatecore.Policy{
		Lease: p.Lease, MaxWait: p.MaxWait, OnLostOutcome: p.OnLostOutcome, ExecutionTimeout: p.ExecutionTimeout, FinishAfterReply: p.FinishAfterReply,
	}, retention)
	if p.Reconcile != nil {
		c.Reconcile = func(ctx context.Context) (gatecore.Resolution, error) {
			res, err := p.Reconcile(ctx, key, call.Params.Arguments)
			if err != nil {
				return gatecore.StillUnknown(), err
			}
			return res.core()
		}
	}
	answer, _, err := g.engine.Gate(ctx, c, &toolCall{g: g, next: next, req: call, r: r, derived: derived}, arrived)
	if err != nil {
		return mcpwire.ErrorResult(err), nil
	}
	switch a := answer.(type) {
	case *storedResult:
		return a, nil
	case passthrough:
		return a.res, a.err
	}
	return nil, fmt.Errorf("mcpgate: the gate answered %T", answer)
}

// Replay implements gatecore.Transport.
func (t *toolCall) Replay(_ context.Context, s gatecore.Stored) (any, error, bool) {
	res, err := replay(s.Outcome, true, t.derived)
	if err != nil {
		return nil, err, false
	}
	return res, nil, true
}

// Committed implements gatecore.Transport; an MCP result has no headers.
func (t *toolCall) Committed(context.Context, time.Time) {}

// Run implements gatecore.Transport: the tool, and what its answer means.
// A mark (idemgate.FinalError, idemgate.RetryableError, idemgate.OutcomeUnknownError) decides first,
// on the tool's error or on the error a typed tool's error result carries;
// then an error that leaves the outcome unknown (unknownOutcome); then any
// other error, a result that asks for input and an error result not
// replayed (ReplayErrors) release the key; any other result is the outcome.
func (t *toolCall) Run(hctx context.Context, _ *gatecore.Attempt) gatecore.Ran {
	res, err := t.next(hctx, "tools/call", t.req)
	result, _ := res.(*mcp.CallToolResult)
	toolErr := err
	if toolErr == nil && result != nil && result.IsError {
		toolErr = result.GetError() // a typed tool's error, as mcp.AddTool reports it
	}
	pass := passthrough{res: res, err: err}
	verdict, inner, marked := gatecore.Marked(toolErr)
	switch {
	case marked:
	case unknownOutcome(toolErr):
		verdict = gatecore.VerdictUnknown
	case err != nil, result == nil, result.NeedsInput(), result.IsError && !t.r.policy.ReplayErrors:
		verdict = gatecore.VerdictNotRun
	default:
		verdict = gatecore.VerdictOutcome
	}
	switch verdict {
	case gatecore.VerdictUnknown:
		return gatecore.Ran{Verdict: verdict, Answer: pass, Code: unknownCause(toolErr, marked), Message: inner.Error()}
	case gatecore.VerdictOutcome:
	default:
		return gatecore.Ran{Verdict: verdict, Answer: pass}
	}
	if result == nil {
		// A final error with no result (a raw tool's error): stored as the
		// error result every duplicate gets.
		result = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: inner.Error()}}}
	}
	raw, err := json.Marshal(result)
	if err != nil {
		return gatecore.Ran{Verdict: gatecore.VerdictLost, Answer: passthrough{err: fmt.Errorf("encoding the tool's result: %w", err)},
			Why: "the tool's result does not encode", Attrs: []slog.Attr{slog.Any("error", err)}}
	}
	outcome, err := gatecore.MarshalAny(wrapperspb.Bytes(raw))
	if err != nil {
		return gatecore.Ran{Verdict: gatecore.VerdictLost, Answer: pass, Why: "the tool's result cannot be stored", Attrs: []slog.Attr{slog.Any("error", err)}}
	}
	return gatecore.Ran{Verdict: gatecore.VerdictOutcome, Outcome: outcome, Answer: &storedResult{raw: raw, replayed: false, derived: t.derived}}
}

// unknownOutcome reports whether a tool's error leaves its side effect's
// outcome unknown, as the interceptor classifies it: it wraps
// context.DeadlineExceeded or context.Canceled (its provider call timed out,
// or it ran past its ExecutionTimeout), or it carries the gRPC code
// DEADLINE_EXCEEDED or CANCELLED (its provider's gRPC call ended so).
func unknownOutcome(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		switch se.GRPCStatus().Code() {
		case codes.DeadlineExceeded, codes.Canceled:
			return true
		}
	}
	return false
}

// unknownCause names what an error that leaves the outcome unknown is, for
// the refusal.
func unknownCause(err error, marked bool) string {
	switch {
	case marked:
		return "an error marked idemgate.OutcomeUnknownError"
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return "a context error"
	}
	return "the gRPC code " + grpcerr.CodeName(status.Code(err))
}

var bytesName = (&wrapperspb.BytesValue{}).ProtoReflect().Descriptor().FullName()

// replay answers with a stored outcome, or the refusal of one it cannot
// replay.
func replay(outcome *anypb.Any, replayed, derived bool) (*storedResult, error) {
	if err := gatecore.TooLarge(outcome); err != nil {
		return nil, err
	}
	v := &wrapperspb.BytesValue{}
	if outcome.MessageName() != bytesName || proto.Unmarshal(outcome.GetValue(), v) != nil || !json.Valid(v.GetValue()) {
		return nil, grpcerr.New(codes.Internal, idemgate.ReasonOutcomeTypeMismatch,
			fmt.Sprintf("the stored outcome is a %s, not a tool result; the call was not run again", outcome.MessageName()), nil, 0)
	}
	return &storedResult{raw: v.GetValue(), replayed: replayed, derived: derived}, nil
}

// storedResult is a tool result as stored: it marshals to the stored bytes,
// with MetaReplayed (and MetaKeyDerived) added to its _meta, so the first
// caller and every duplicate get the same bytes but for that mark.
type storedResult struct {
	// ResultBase makes it an mcp.Result; members the SDK sets in its Meta
	// (the server's identity at 2026-07-28) are added to the stored _meta's.
	mcp.ResultBase
	raw               []byte
	replayed, derived bool
}

// AnswerSize is the stored result's size, what the answer budget counts
// (mcpwire.HoldAnswers).
func (s *storedResult) AnswerSize() int64 { return int64(len(s.raw)) }

// MarshalJSON writes the stored result with the replay mark.
func (s *storedResult) MarshalJSON() ([]byte, error) {
	return marked(s.raw, s.replayed, s.derived, s.Meta)
}

// marked returns raw (a JSON object) with _meta[MetaReplayed] set,
// _meta[MetaKeyDerived] when derived, and each member of extra the stored
// _meta lacks; without resultType, which is the protocol version's framing
// (mcpwire.MarkComplete adds it for the caller's version), not the outcome.
// Members keep their bytes; their order is sorted, the same on every call.
func marked(raw []byte, replayed, derived bool, extra map[string]any) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	delete(obj, "resultType")
	meta := map[string]json.RawMessage{}
	if m, ok := obj["_meta"]; ok && !bytes.Equal(bytes.TrimSpace(m), []byte("null")) {
		if err := json.Unmarshal(m, &meta); err != nil {
			return nil, err
		}
	}
	for k, v := range extra {
		if _, ok := meta[k]; ok {
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		meta[k] = b
	}
	meta[MetaReplayed] = json.RawMessage(fmt.Sprint(replayed))
	if derived {
		meta[MetaKeyDerived] = json.RawMessage("true")
	}
	m, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	obj["_meta"] = m
	return json.Marshal(obj)
}

// arguments parses the call's arguments: a JSON object, or nothing.
func arguments(raw json.RawMessage) (map[string]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return map[string]json.RawMessage{}, nil
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal(raw, &args); err != nil {
		return nil, grpcerr.New(codes.InvalidArgument, ReasonArgumentsInvalid, "the arguments are not a JSON object: "+err.Error(), nil, 0)
	}
	return args, nil
}

// keyArgNames returns the names of the tool's key arguments, sorted.
func (r *resolved) keyArgNames() []string {
	names := make([]string, 0, len(r.keyArgs))
	for name := range r.keyArgs {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// keyOf returns the call's key: _meta[MetaKey], then the key argument, then
// SEP-3182's parameter. Carriers that disagree are a conflict.
func (g *Gate) keyOf(call *mcp.CallToolRequest, r *resolved, args map[string]json.RawMessage) (string, bool, error) {
	metaKey, hasMeta, err := mcpwire.CallKey(call.Params.GetMeta())
	if err != nil {
		return "", false, err
	}
	key, hasKey := metaKey, hasMeta
	from := mcpwire.CallKeyCarriers // where key came from, for a conflict
	for _, name := range r.keyArgNames() {
		v, ok := args[name]
		if !ok || bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			continue
		}
		var s string
		if json.Unmarshal(v, &s) != nil {
			return "", false, grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyInvalid, "the key argument "+name+" must be a string", nil, 0)
		}
		if s == "" {
			continue
		}
		if hasKey && s != key {
			return "", false, grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyConflict,
				fmt.Sprintf("%s and the argument %s carry different idempotency keys; send one, or the same in both", from, name),
				map[string]string{"field": name}, 0)
		}
		key, hasKey, from = s, true, "the argument "+name
	}
	if !hasKey {
		return "", false, nil
	}
	if err := keys.Validate(key); err != nil {
		return "", false, grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyInvalid,
			"the idempotency key "+err.Error()+": use 1 to 255 bytes of printable ASCII without leading or trailing spaces, such as a UUID", nil, 0)
	}
	return key, true, nil
}

// Fingerprint is the SHA-256 of args in RFC 8785 (JCS) canonical JSON,
// without the members named in keyArgs and exclude: member order and
// insignificant whitespace never change it, nor how a number or a string is
// spelled ("1e2" and 100, "\u0041" and "A"). Numbers are IEEE 754 doubles in
// JCS, so two integers above 2^53 that round to the same double have one
// fingerprint: send such identifiers as strings. A string with a \u escape
// of a lone UTF-16 surrogate is an error. It takes time linear in the size
// of args (n log n in the members of each object), and memory linear too.
func Fingerprint(args map[string]json.RawMessage, keyArgs, exclude map[string]bool) ([]byte, error) {
	kept := make(map[string]json.RawMessage, len(args))
	for name, v := range args {
		if !keyArgs[name] && !exclude[name] {
			kept[name] = v
		}
	}
	b, err := json.Marshal(kept)
	if err != nil {
		return nil, err
	}
	canonical, _, err := canonicalJSON(b)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(canonical)
	return sum[:], nil
}

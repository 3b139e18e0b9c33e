package mcpbridge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/mcpwire"
)

// Config configures a bridge.
type Config struct {
	// Conn is the connection to the tool server. Required.
	Conn grpc.ClientConnInterface
	// Files holds the tool server's descriptors (LoadDescriptorSet,
	// LoadReflection). Required.
	Files *protoregistry.Files
	// Services names the services to serve, by full name. Defaults to every
	// service in Files except gRPC's own (grpc.*).
	Services []string
	// CallTimeout bounds each forwarded gRPC call. A gated handler keeps
	// running when it fires (the gate detaches it from the caller), so a
	// retry with the same key gets its outcome. Defaults to 60s.
	CallTimeout time.Duration
	// Name and Version are the server's implementation info. Default to
	// "idemgate-mcp" and "dev".
	Name, Version string
	// Logger logs each forwarded call's failures. Defaults to discarding.
	Logger *slog.Logger
	// KeyArgument, when set, adds a required string argument of this name
	// to the input schema of every gated tool (KeyArgumentTools narrows
	// them), marked as the key, for hosts that send only the arguments the
	// model writes and never _meta (a stock desktop or IDE host over
	// stdio). The bridge takes it out of the arguments and forwards it as
	// the key; the tool server never sees it. Defaults to none: the key
	// comes from _meta or SEP-3182's parameter only.
	KeyArgument string
	// KeyArgumentTools names the gated tools that get KeyArgument, by
	// their full names. Defaults to every gated tool.
	KeyArgumentTools []string
}

// Method is one tool the bridge serves.
type Method struct {
	// Tool is the MCP tool, as listed.
	Tool *mcp.Tool
	// Descriptor is the gRPC method behind the tool.
	Descriptor protoreflect.MethodDescriptor
	// Class is the method's policy class.
	Class Class
	// KeyArgument is the argument added to the tool's input schema that
	// carries the key (Config.KeyArgument), or "".
	KeyArgument string
}

// Methods returns the tools cfg would serve, in name order, without a
// connection: a unary method of each selected service becomes a tool named by
// its full name ("examples.payments.v1.PaymentsService.ChargeCard");
// streaming methods are left out (the gate stores only unary outcomes).
func Methods(cfg Config) ([]Method, error) {
	if cfg.Files == nil {
		return nil, errors.New("mcpbridge: Config.Files is required")
	}
	names := cfg.Services
	if len(names) == 0 {
		cfg.Files.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
			for i := 0; i < fd.Services().Len(); i++ {
				name := string(fd.Services().Get(i).FullName())
				if !strings.HasPrefix(name, "grpc.") {
					names = append(names, name)
				}
			}
			return true
		})
	}
	keyTools := map[string]bool{}
	for _, name := range cfg.KeyArgumentTools {
		keyTools[name] = true
	}
	if cfg.KeyArgument != "" {
		if err := mcpwire.CheckKeyArgumentName(cfg.KeyArgument); err != nil {
			return nil, fmt.Errorf("mcpbridge: %w", err)
		}
	} else if len(keyTools) > 0 {
		return nil, errors.New("mcpbridge: Config.KeyArgumentTools needs Config.KeyArgument")
	}
	var methods []Method
	for _, name := range names {
		d, err := cfg.Files.FindDescriptorByName(protoreflect.FullName(name))
		if err != nil {
			return nil, fmt.Errorf("mcpbridge: service %q: not in the descriptors", name)
		}
		sd, ok := d.(protoreflect.ServiceDescriptor)
		if !ok {
			return nil, fmt.Errorf("mcpbridge: %q is not a service", name)
		}
		for i := 0; i < sd.Methods().Len(); i++ {
			md := sd.Methods().Get(i)
			if md.IsStreamingClient() || md.IsStreamingServer() {
				continue
			}
			m := Method{Descriptor: md, Class: Classify(md)}
			if cfg.KeyArgument != "" && m.Class == Gated && (len(keyTools) == 0 || keyTools[string(md.FullName())]) {
				m.KeyArgument = cfg.KeyArgument
				delete(keyTools, string(md.FullName()))
			}
			t, err := tool(md, m.KeyArgument)
			if err != nil {
				return nil, fmt.Errorf("mcpbridge: tool %s: %w", md.FullName(), err)
			}
			m.Tool = t
			methods = append(methods, m)
		}
	}
	if len(keyTools) > 0 {
		var unknown []string
		for name := range keyTools {
			unknown = append(unknown, name)
		}
		sort.Strings(unknown)
		return nil, fmt.Errorf("mcpbridge: Config.KeyArgumentTools names %s, not gated tools this bridge serves", strings.Join(unknown, ", "))
	}
	sort.Slice(methods, func(i, j int) bool { return methods[i].Tool.Name < methods[j].Tool.Name })
	return methods, nil
}

// tool is the MCP tool of a method; keyArg, when set, is added to its input
// schema as the key argument.
func tool(md protoreflect.MethodDescriptor, keyArg string) (*mcp.Tool, error) {
	class := Classify(md)
	t := &mcp.Tool{
		Name:        string(md.FullName()),
		Title:       string(md.Parent().Name()) + "." + string(md.Name()),
		InputSchema: Schema(md.Input()),
		Annotations: annotations(class),
	}
	if keyArg != "" {
		s, err := mcpwire.WithKeyArgument(t.InputSchema, keyArg)
		if err != nil {
			return nil, err
		}
		t.InputSchema = s
	}
	if objectJSON(md.Output()) {
		t.OutputSchema = OutputSchema(md.Output())
	}
	desc := comment(md)
	switch class {
	case Gated:
		carrier := "Send the key in _meta[\"" + MetaKey + "\"]: minted once per logical action, reused on every retry of it."
		if keyArg != "" {
			carrier = "Send the key as the argument " + keyArg + " (or in _meta[\"" + MetaKey + "\"]): one value per action, the same value again when you retry or repeat that action."
		}
		if keylessAllowed(md) {
			desc += "\n\nHas a side effect that runs once per idempotency key. " + carrier + " Keyless calls are deduplicated on their arguments for a short window."
		} else {
			desc += "\n\nHas a side effect that runs once per idempotency key: a call without one is refused (IDEMPOTENCY_KEY_MISSING). " + carrier
		}
	case ReadOnly:
		desc += "\n\nRead-only: needs no idempotency key."
	}
	t.Description = strings.TrimSpace(desc)
	return t, nil
}

// annotations maps a policy class to MCP's hints: a read-only method is
// readOnlyHint; a gated one may be destructive and is not idempotentHint
// (the hint says repeating a call with the same arguments has no further
// effect, untrue of a gated call without its key, and mcpgate reads it as
// "not gated"); an IDEMPOTENT one is idempotentHint; an unclassified or
// not-mutating one claims nothing beyond MCP's defaults (destructive, not
// idempotent), stated explicitly.
func annotations(c Class) *mcp.ToolAnnotations {
	yes, no := true, false
	switch c {
	case ReadOnly:
		return &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, DestructiveHint: &no}
	case Idempotent:
		return &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: &yes}
	case Gated:
		return &mcp.ToolAnnotations{IdempotentHint: false, DestructiveHint: &yes}
	}
	return &mcp.ToolAnnotations{DestructiveHint: &yes}
}

// New returns an MCP server serving cfg's methods as tools, forwarding each
// call to cfg.Conn. Serve it with server.Run(ctx, &mcp.IOTransport{Reader:
// KeyReader(os.Stdin), ...}) or HTTPHandler (stateless streamable HTTP).
func New(cfg Config) (*mcp.Server, error) {
	if cfg.Conn == nil {
		return nil, errors.New("mcpbridge: Config.Conn is required")
	}
	methods, err := Methods(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 60 * time.Second
	}
	if cfg.Name == "" {
		cfg.Name = "idemgate-mcp"
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	server := mcp.NewServer(&mcp.Implementation{Name: cfg.Name, Version: cfg.Version}, &mcp.ServerOptions{
		Capabilities: mcpwire.Capabilities(),
	})
	// Each answer is encoded once (encodeOnce) and, over HTTP, held within
	// the answer budget (mcpwire.HoldAnswers) until it is written.
	server.AddReceivingMiddleware(mcpwire.AdvertiseIdempotency, mcpwire.HoldAnswers, encodeOnce)
	f := &forwarder{conn: cfg.Conn, types: dynamicpb.NewTypes(cfg.Files), timeout: cfg.CallTimeout, logger: cfg.Logger}
	for _, m := range methods {
		server.AddTool(m.Tool, f.handler(m.Descriptor, m.KeyArgument))
	}
	return server, nil
}

type forwarder struct {
	conn    grpc.ClientConnInterface
	types   *dynamicpb.Types
	timeout time.Duration
	logger  *slog.Logger
}

func (f *forwarder) handler(md protoreflect.MethodDescriptor, keyArg string) mcp.ToolHandler {
	fullMethod := "/" + string(md.Parent().FullName()) + "/" + string(md.Name())
	structured := objectJSON(md.Output())
	gated, kf := Classify(md) == Gated, keyField(md)
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		caller, err := callerOf(req)
		if err != nil {
			return mcpwire.ErrorResult(err), nil
		}
		key, hasKey, err := mcpwire.CallKey(req.Params.GetMeta())
		if err != nil {
			return mcpwire.ErrorResult(err), nil
		}
		args := req.Params.Arguments
		if keyArg != "" {
			if key, hasKey, args, err = argumentKey(key, hasKey, args, keyArg); err != nil {
				return mcpwire.ErrorResult(err), nil
			}
		}
		in := dynamicpb.NewMessage(md.Input())
		args = bytes.TrimSpace(args)
		if len(args) == 0 || bytes.Equal(args, []byte("null")) {
			args = []byte("{}")
		}
		if err := (protojson.UnmarshalOptions{Resolver: f.types}).Unmarshal(args, in); err != nil {
			return mcpwire.ErrorResult(grpcerr.New(codes.InvalidArgument, ReasonArgumentsInvalid,
				"the arguments are not a valid "+string(md.Input().FullName())+": "+err.Error(), nil, 0)), nil
		}
		if caller != "" {
			// One tenant at the tool server's gate: the caller's own keys.
			if key, hasKey, err = forCaller(caller, key, hasKey, in, kf, gated, keyArg); err != nil {
				return mcpwire.ErrorResult(err), nil
			}
		}
		ctx, cancel := context.WithTimeout(ctx, f.timeout)
		defer cancel()
		if hasKey {
			ctx = metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, key)
		}
		out := dynamicpb.NewMessage(md.Output())
		var header metadata.MD
		if err := f.conn.Invoke(ctx, fullMethod, in, out, grpc.Header(&header)); err != nil {
			f.logger.Info("tool call failed", slog.String("method", fullMethod), slog.Any("error", err))
			if grpcerr.Reason(err) == idemgate.ReasonKeyMissing {
				// The tool server names its gRPC carrier; the MCP client
				// has its own.
				err = mcpwire.ReplaceMessage(err, mcpwire.KeyMissingMessage(keyArgNames(keyArg)...))
			}
			return mcpwire.ErrorResult(err), nil
		}
		js, err := resultJSON(f.types, out)
		if err != nil {
			return nil, fmt.Errorf("encoding the response: %w", err)
		}
		res := textResult(js, structured)
		meta := mcp.Meta{MetaReplayed: headerTrue(header, idemgate.ReplayedHeader)}
		if headerTrue(header, idemgate.KeyDerivedHeader) {
			meta[MetaKeyDerived] = true
		}
		res.SetMeta(meta)
		return res, nil
	}
}

// argumentKey takes the key argument out of args: the key is _meta's (key,
// hasKey) or the argument's, and both present and different is
// IDEMPOTENCY_KEY_CONFLICT.
func argumentKey(key string, hasKey bool, args json.RawMessage, name string) (string, bool, json.RawMessage, error) {
	argKey, hasArg, rest, err := mcpwire.TakeArgument(args, name)
	switch {
	case err != nil:
		return "", false, nil, err
	case !hasArg:
		return key, hasKey, rest, nil
	case hasKey && argKey != key:
		return "", false, nil, grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyConflict,
			fmt.Sprintf("%s and the argument %s carry different idempotency keys; send one, or the same in both", mcpwire.CallKeyCarriers, name),
			map[string]string{"field": name}, 0)
	}
	if err := mcpwire.CheckKeyChars(argKey); err != nil {
		return "", false, nil, err
	}
	return argKey, true, rest, nil
}

func keyArgNames(keyArg string) []string {
	if keyArg == "" {
		return nil
	}
	return []string{keyArg}
}

func headerTrue(md metadata.MD, name string) bool {
	v := md.Get(name)
	return len(v) > 0 && v[0] == "true"
}

// resultJSON is the JSON of a response as the bridge returns it: its
// protojson with every field, zero values too (so a model can tell 0 from
// unknown; an unset message field is null, as the schema allows), compacted,
// and with its 64-bit integers as JSON numbers rather than protojson's
// strings (int64Numbers; OutputSchema says so), exact in the text above 2^53
// too. protojson varies its whitespace between builds on purpose;
// compacted, a replay's text is byte-identical to the original's whichever
// bridge process serves it.
func resultJSON(types interface {
	protoregistry.ExtensionTypeResolver
	protoregistry.MessageTypeResolver
}, m proto.Message) ([]byte, error) {
	// One buffer for protojson, sized by the message's wire size (about its
	// JSON's for the strings and bytes that make a response large),
	// compacted in place; int64Numbers writes the one copy returned.
	size := proto.Size(m)
	buf := make([]byte, 0, size+size/4+512)
	js, err := (protojson.MarshalOptions{Resolver: types, EmitUnpopulated: true}).MarshalAppend(buf, m)
	if err != nil {
		return nil, err
	}
	return int64Numbers(compactInPlace(js), m.ProtoReflect().Descriptor(), types)
}

// compactInPlace removes the whitespace between the tokens of valid JSON
// (protojson's), in place, as json.Compact would; int64Numbers checks the
// rest.
func compactInPlace(js []byte) []byte {
	out := js[:0]
	inString, escaped := false, false
	for _, c := range js { // out never passes the byte being read
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			continue
		}
		out = append(out, c)
	}
	return out
}

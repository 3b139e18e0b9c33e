package mcpgate_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/gatetest"
	"github.com/idemgate/idemgate/mcpgate"
)

// TestConformance runs the gate conformance suite against mcpgate: each
// ConformanceService method is a tool with the method's policy
// (mcpgate.WithTool), its arguments the request's JSON, served over
// streamable HTTP on loopback to the Go SDK's client.
func TestConformance(t *testing.T) {
	gatetest.Run(t, newConformanceGate)
}

// conformanceTools maps each method to its tool policy, or to why mcpgate
// cannot express it.
func conformanceTools() (map[string]mcpgate.ToolPolicy, map[string]error) {
	sd := testingv1.File_idemgate_testing_v1_conformance_proto.Services().ByName("ConformanceService")
	policies, unsupported := map[string]mcpgate.ToolPolicy{}, map[string]error{}
	for _, m := range gatetest.Methods {
		md := sd.Methods().ByName(protoreflect.Name(m))
		p, err := toolPolicy(md)
		if err != nil {
			unsupported[m] = err
			continue
		}
		policies[m] = p
	}
	return policies, unsupported
}

// toolPolicy is the ToolPolicy of a method's (idemgate.v1.policy).
func toolPolicy(md protoreflect.MethodDescriptor) (mcpgate.ToolPolicy, error) {
	mp, _ := proto.GetExtension(md.Options(), idemgatev1.E_Policy).(*idemgatev1.MethodPolicy)
	if len(mp.GetUnknownCodes()) > 0 {
		return mcpgate.ToolPolicy{}, fmt.Errorf("%w: mcpgate cannot express unknown_codes for %s", gatetest.ErrUnsupported, md.Name())
	}
	p := mcpgate.ToolPolicy{
		Lease:            mp.GetLease().AsDuration(),
		MaxWait:          mp.GetMaxWait().AsDuration(),
		ExecutionTimeout: mp.GetExecutionTimeout().AsDuration(),
		Retention:        mp.GetRetention().AsDuration(),
		OnLostOutcome:    mp.GetOnLostOutcome(),
		FinishAfterReply: mp.GetFinish() == idemgatev1.FinishPolicy_FINISH_POLICY_AFTER_REPLY,
		// replay_codes: mcpgate stores every isError result or none.
		ReplayErrors: len(mp.GetReplayCodes()) > 0,
	}
	if mp.GetMaxWait() == nil {
		p.MaxWait = mcpgate.DefaultMaxWait
	} else if p.MaxWait == 0 {
		// ToolPolicy reads a zero MaxWait as the default; NoWait is max_wait 0.
		p.NoWait = true
	}
	fields := md.Input().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if fp, _ := proto.GetExtension(f.Options(), idemgatev1.E_Field).(*idemgatev1.FieldPolicy); fp.GetExcludeFromFingerprint() {
			p.ExcludeArguments = append(p.ExcludeArguments, f.JSONName())
		}
	}
	return p, nil
}

func newConformanceGate(t *testing.T, cfg gatetest.Config) gatetest.Client {
	t.Helper()
	policies, unsupported := conformanceTools()
	dconn, err := grpc.NewClient(cfg.DedupeAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
	if err != nil {
		t.Fatalf("dial the Dedupe service: %v", err)
	}
	t.Cleanup(func() { _ = dconn.Close() })
	server := mcp.NewServer(&mcp.Implementation{Name: "conformance", Version: "1"}, nil)
	opts := []mcpgate.Option{mcpgate.WithLogger(quiet()), mcpgate.WithSingleTenant(), mcpgate.WithDedupeConn(dconn), mcpgate.WithInFlightRetryAfter(200 * time.Millisecond)}
	for name, p := range policies {
		server.AddTool(&mcp.Tool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)}, conformanceTool(name, cfg.Handler))
		opts = append(opts, mcpgate.WithTool(name, p))
	}
	if cfg.ReplayCache {
		opts = append(opts, mcpgate.WithReplayCache(256, 1<<20))
	}
	gate, err := mcpgate.New(context.Background(), idemgatev1.NewDedupeServiceClient(dconn), server, opts...)
	if err != nil {
		t.Fatalf("mcpgate.New: %v", err)
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{JSONResponse: true})
	ts := httptest.NewServer(mcpgate.HTTPMiddleware(h))
	t.Cleanup(func() {
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	session := connect(t, &mcp.StreamableClientTransport{Endpoint: ts.URL})
	return conformanceClient{session: session, unsupported: unsupported}
}

// conformanceTool serves the suite's handler as a tool: a response as
// structured content and its JSON as text; a failure as an isError result
// whose structured content names its code.
func conformanceTool(method string, handle gatetest.Handler) mcp.ToolHandler {
	return func(ctx context.Context, call *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		req := &testingv1.ConformanceRequest{}
		if err := protojson.Unmarshal(call.Params.Arguments, req); err != nil {
			return nil, err
		}
		resp, err := handle(ctx, method, req)
		var f *gatetest.Failure
		switch {
		case errors.As(err, &f):
			out, _ := json.Marshal(map[string]string{"code": grpcerr.CodeName(f.Code), "message": f.Message})
			res := &mcp.CallToolResult{IsError: true, StructuredContent: json.RawMessage(out), Content: []mcp.Content{&mcp.TextContent{Text: f.Error()}}}
			switch f.Kind {
			case gatetest.Final:
				res.SetError(idemgate.FinalError(f))
			case gatetest.Retryable:
				res.SetError(idemgate.RetryableError(f))
			case gatetest.OutcomeUnknown:
				res.SetError(idemgate.OutcomeUnknownError(f))
			}
			res.StructuredContent = json.RawMessage(out)
			return res, nil
		case err != nil:
			// As mcp.AddTool reports a typed handler's error.
			res := &mcp.CallToolResult{}
			res.SetError(err)
			return res, nil
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			return nil, err
		}
		return &mcp.CallToolResult{StructuredContent: json.RawMessage(out), Content: []mcp.Content{&mcp.TextContent{Text: string(out)}}}, nil
	}
}

type conformanceClient struct {
	session     *mcp.ClientSession
	unsupported map[string]error
}

func (c conformanceClient) Call(ctx context.Context, method, key string, req *testingv1.ConformanceRequest) gatetest.Answer {
	if err := c.unsupported[method]; err != nil {
		return gatetest.Answer{Err: err, Code: codes.Unimplemented}
	}
	args, err := protojson.Marshal(req)
	if err != nil {
		return gatetest.Answer{Code: codes.Internal, Err: err}
	}
	p := &mcp.CallToolParams{Name: method, Arguments: json.RawMessage(args)}
	if key != "" {
		p.Meta = mcp.Meta{mcpgate.MetaKey: key}
	}
	res, err := c.session.CallTool(ctx, p)
	if err != nil {
		code := codes.Unknown
		if ctx.Err() != nil {
			code = codes.Canceled
		}
		return gatetest.Answer{Code: code, Err: err}
	}
	a := gatetest.Answer{Replayed: res.Meta[mcpgate.MetaReplayed] == true}
	delete(res.Meta, mcpgate.MetaReplayed)
	if len(res.Meta) == 0 {
		res.Meta = nil
	}
	a.Body, _ = json.Marshal(res)
	if res.IsError {
		a.Code, a.Err = codes.Unknown, fmt.Errorf("tool error: %s", a.Body)
		if e, ok := res.Meta[mcpgate.MetaError].(map[string]any); ok {
			a.Code, _ = grpcerr.CodeByName(fmt.Sprint(e["code"]))
			a.Reason, _ = e["reason"].(string)
			if s, ok := e["retryAfterSeconds"].(float64); ok {
				a.RetryAfter = time.Duration(s * float64(time.Second))
			}
		} else if m, ok := res.StructuredContent.(map[string]any); ok {
			a.Code, _ = grpcerr.CodeByName(fmt.Sprint(m["code"]))
		}
		return a
	}
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return gatetest.Answer{Code: codes.Internal, Err: err}
	}
	a.Response = &testingv1.ConformanceResponse{}
	if err := protojson.Unmarshal(raw, a.Response); err != nil {
		return gatetest.Answer{Code: codes.Internal, Err: fmt.Errorf("the result is no ConformanceResponse: %w (%s)", err, a.Body)}
	}
	return a
}

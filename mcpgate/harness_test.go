package mcpgate_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/internal/testing/testlog"
	"github.com/idemgate/idemgate/mcpgate"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// embeddedDedupe is a Dedupe service on the embedded store, called in
// process.
func embeddedDedupe(t *testing.T) idemgatev1.DedupeServiceClient {
	t.Helper()
	store, err := sqlitestore.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return dedupesvc.NewInProcessClient(dedupesvc.NewServer(store, dedupesvc.WithNotifier(store), dedupesvc.WithLogger(quiet())))
}

// grpcDedupe is the real Dedupe service on a fresh PostgreSQL schema,
// served over loopback gRPC.
func grpcDedupe(t *testing.T) idemgatev1.DedupeServiceClient {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	store := pgstore.New(pool, pgstore.WithChannel(schema), pgstore.WithoutNotify())
	srv := grpc.NewServer()
	idemgatev1.RegisterDedupeServiceServer(srv, dedupesvc.NewServer(store, dedupesvc.WithLogger(quiet()), dedupesvc.WithPollInterval(20*time.Millisecond)))
	conn := stacktest.Serve(t, srv, grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
	return idemgatev1.NewDedupeServiceClient(conn)
}

type chargeIn struct {
	Customer string `json:"customer"`
	Amount   int    `json:"amount"`
	Note     string `json:"note,omitempty"`
	OrderID  string `json:"order_id,omitempty"`
}

type chargeOut struct {
	ChargeID string `json:"charge_id"`
	Customer string `json:"customer"`
	Amount   int    `json:"amount"`
}

// tools is the test server's tools and what they did.
type tools struct {
	// noKeyMark leaves order_id unmarked, so charge has no key argument of
	// its own (the key-argument tests add one).
	noKeyMark bool
	charges   atomic.Int64 // side effects of charge
	balances  atomic.Int64 // runs of balance
	flaky     atomic.Int64 // runs of flaky
	// hold, when set, makes charge wait for it (or its context) after
	// saying so on started.
	hold    chan struct{}
	started chan struct{}
	// ended receives charge's context error when it returns.
	ended chan error
}

// newServer is an MCP server with a gated charge (no annotations: MCP's
// defaults), a read-only balance, and flaky, which fails its first run.
func (ts *tools) newServer() *mcp.Server {
	server := mcp.NewServer(&mcp.Implementation{Name: "payments-test", Version: "1"}, nil)
	schema, err := jsonschema.For[chargeIn](nil)
	if err != nil {
		panic(err)
	}
	schema.Properties["note"].Extra = map[string]any{mcpgate.SchemaExclude: true}
	if !ts.noKeyMark {
		schema.Properties["order_id"].Extra = map[string]any{mcpgate.SchemaKey: true}
	}
	mcp.AddTool(server, &mcp.Tool{Name: "charge", Description: "charges a card", InputSchema: schema},
		func(ctx context.Context, _ *mcp.CallToolRequest, in chargeIn) (*mcp.CallToolResult, chargeOut, error) {
			if ts.hold != nil {
				ts.started <- struct{}{}
				select {
				case <-ts.hold:
				case <-ctx.Done():
					ts.ended <- ctx.Err()
					return nil, chargeOut{}, ctx.Err()
				}
				ts.ended <- ctx.Err()
			}
			n := ts.charges.Add(1)
			return nil, chargeOut{ChargeID: fmt.Sprintf("ch_%06d", n), Customer: in.Customer, Amount: in.Amount}, nil
		})
	mcp.AddTool(server, &mcp.Tool{Name: "balance", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, map[string]int64, error) {
			return nil, map[string]int64{"charges": ts.charges.Load(), "reads": ts.balances.Add(1)}, nil
		})
	mcp.AddTool(server, &mcp.Tool{Name: "flaky", Annotations: &mcp.ToolAnnotations{}},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			if ts.flaky.Add(1) == 1 {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "card declined"}}}, nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
		})
	return server
}

// fixture is a gated server and a Go SDK client connected to it in memory,
// every message the client read kept in wire.
type fixture struct {
	tools  *tools
	gate   *mcpgate.Gate
	client *mcp.ClientSession
	wire   *syncBuffer
}

func setup(t *testing.T, dedupe idemgatev1.DedupeServiceClient, opts ...mcpgate.Option) *fixture {
	t.Helper()
	return setupTools(t, &tools{}, dedupe, opts...)
}

// setupTools is setup with the test server's tools as ts configures them.
func setupTools(t *testing.T, ts *tools, dedupe idemgatev1.DedupeServiceClient, opts ...mcpgate.Option) *fixture {
	t.Helper()
	f := &fixture{tools: ts, wire: &syncBuffer{}}
	server := f.tools.newServer()
	gate, err := mcpgate.New(context.Background(), dedupe, server, append([]mcpgate.Option{mcpgate.WithLogger(quiet())}, opts...)...)
	if err != nil {
		t.Fatalf("mcpgate.New: %v", err)
	}
	f.gate = gate
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	ct, st := mcp.NewInMemoryTransports()
	ss, err := server.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	f.client = connect(t, &mcp.LoggingTransport{Transport: ct, Writer: f.wire})
	return f
}

func connect(t *testing.T, transport mcp.Transport) *mcp.ClientSession {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil).Connect(context.Background(), transport, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// httpServer serves server over streamable HTTP (JSON responses) with the
// SEP-3182 carrier, inside wrap when set (authentication).
func httpServer(t *testing.T, server *mcp.Server, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{JSONResponse: true})
	handler := mcpgate.HTTPMiddleware(h)
	if wrap != nil {
		handler = wrap(handler)
	}
	ts := httptest.NewServer(handler)
	t.Cleanup(ts.Close)
	return ts.URL
}

func callCtx(t *testing.T, ctx context.Context, s *mcp.ClientSession, name, key string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	if key != "" {
		p.Meta = mcp.Meta{mcpgate.MetaKey: key}
	}
	res, err := s.CallTool(ctx, p)
	if err != nil {
		t.Fatalf("CallTool %s: %v", name, err)
	}
	return res
}

func call(t *testing.T, s *mcp.ClientSession, name, key string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return callCtx(t, ctx, s, name, key, args)
}

func replayed(res *mcp.CallToolResult) bool {
	v, _ := res.Meta[mcpgate.MetaReplayed].(bool)
	return v
}

func errInfo(res *mcp.CallToolResult) map[string]any {
	e, _ := res.Meta[mcpgate.MetaError].(map[string]any)
	return e
}

// wantReason fails unless res is a refusal with reason.
func wantReason(t *testing.T, res *mcp.CallToolResult, reason string) map[string]any {
	t.Helper()
	e := errInfo(res)
	if !res.IsError || e == nil || e["reason"] != reason {
		t.Fatalf("result = %+v (error %v), want a refusal %s", res, e, reason)
	}
	return e
}

func structured(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %+v %v", res.Content, res.Meta)
	}
	m, _ := res.StructuredContent.(map[string]any)
	if m == nil {
		t.Fatalf("no structured content: %+v", res)
	}
	return m
}

// syncBuffer is a goroutine-safe buffer of wire lines.
type syncBuffer struct{ testlog.Buffer }

// results returns the raw "result" of every response the client read, in
// order.
func (s *syncBuffer) results(t *testing.T) []json.RawMessage {
	t.Helper()
	var out []json.RawMessage
	sc := bufio.NewScanner(bytes.NewReader(s.Bytes()))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "read: ")
		if !ok {
			continue
		}
		var msg struct {
			Result json.RawMessage `json:"result"`
		}
		if json.Unmarshal([]byte(line), &msg) == nil && msg.Result != nil {
			out = append(out, msg.Result)
		}
	}
	return out
}

package mcpwire_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/internal/mcpwire"
)

// The protocol versions the tests speak: the stateless revision and the
// last one with initialize.
const (
	v20260728 = "2026-07-28"
	v20251125 = "2025-11-25"
)

// rawRPC posts one JSON-RPC request to url as a client of version sends it
// over streamable HTTP: at 2026-07-28 with the _meta triple (protocol
// version, client info, client capabilities) and the Mcp-Method and Mcp-Name
// headers, before it without; extra headers are added as given. It returns
// the HTTP status and the JSON-RPC response (from a JSON or an SSE body).
func rawRPC(t *testing.T, url, version, method string, params map[string]any, extra http.Header) (int, map[string]any) {
	t.Helper()
	if params == nil {
		params = map[string]any{}
	}
	if version >= v20260728 {
		meta, _ := params["_meta"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
		}
		meta[mcp.MetaKeyProtocolVersion] = version
		meta[mcp.MetaKeyClientInfo] = map[string]any{"name": "raw", "version": "1"}
		meta[mcp.MetaKeyClientCapabilities] = map[string]any{}
		params["_meta"] = meta
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", version)
	if version >= v20260728 {
		req.Header.Set("Mcp-Method", method)
		if name, ok := params["name"].(string); ok {
			req.Header.Set("Mcp-Name", name)
		}
	}
	for k, v := range extra {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw []byte
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<24)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				raw = []byte(data)
				break
			}
		}
	} else {
		buf := new(bytes.Buffer)
		_, _ = buf.ReadFrom(resp.Body)
		raw = buf.Bytes()
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s at %s: HTTP %d, body %q", method, version, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// wantCapability fails unless caps (a capabilities object as on the wire)
// advertises the idempotency capability everywhere a client may look:
// extensions and experimental under CapabilityName with the settings, and
// SEP-3182's tools.idempotency.
func wantCapability(t *testing.T, where string, caps map[string]any) {
	t.Helper()
	want := map[string]any{"metaKey": mcpwire.MetaKey, "param": mcpwire.ParamKey}
	for _, member := range []string{"extensions", "experimental"} {
		m, _ := caps[member].(map[string]any)
		if got := m[mcpwire.CapabilityName]; !reflect.DeepEqual(got, want) {
			t.Errorf("%s: capabilities.%s[%q] = %v, want %v (capabilities %v)", where, member, mcpwire.CapabilityName, got, want, caps)
		}
	}
	tools, _ := caps["tools"].(map[string]any)
	if got, ok := tools["idempotency"]; !ok || !reflect.DeepEqual(got, map[string]any{}) {
		t.Errorf("%s: capabilities.tools.idempotency = %v, want {} (capabilities %v)", where, got, caps)
	}
}

func addEcho(server *mcp.Server) {
	server.AddTool(&mcp.Tool{Name: "echo", InputSchema: &jsonschema.Schema{Type: "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
		})
}

// The capability is on the initialize result (clients before 2026-07-28)
// and on the server/discover result (2026-07-28), in extensions,
// experimental and tools.idempotency: for a server built with Capabilities
// (the bridge) and for one that only adds the middleware (mcpgate), served
// by HTTPHandler, which serves 2026-07-28.
func TestCapabilityOnInitializeAndDiscover(t *testing.T) {
	for name, opts := range map[string]*mcp.ServerOptions{
		"with Capabilities":   {Capabilities: mcpwire.Capabilities()},
		"middleware only":     nil,
		"other experimentals": {Capabilities: &mcp.ServerCapabilities{Experimental: map[string]any{"x.y/z": map[string]any{}}, Extensions: map[string]any{"x.y/e": map[string]any{"a": 1.0}}}},
	} {
		t.Run(name, func(t *testing.T) {
			server := mcp.NewServer(&mcp.Implementation{Name: "wire-test", Version: "1"}, opts)
			server.AddReceivingMiddleware(mcpwire.AdvertiseIdempotency)
			addEcho(server)
			ts := httptest.NewServer(mcpwire.HTTPHandler(server, mcpwire.HTTPLimits{}))
			defer ts.Close()

			status, out := rawRPC(t, ts.URL, v20260728, "server/discover", nil, nil)
			res, _ := out["result"].(map[string]any)
			if status != http.StatusOK || res == nil {
				t.Fatalf("server/discover at %s: HTTP %d, %v", v20260728, status, out)
			}
			if versions, _ := res["supportedVersions"].([]any); len(versions) == 0 || versions[0] != v20260728 {
				t.Errorf("supportedVersions = %v, want %s first", res["supportedVersions"], v20260728)
			}
			caps, _ := res["capabilities"].(map[string]any)
			wantCapability(t, "server/discover", caps)

			status, out = rawRPC(t, ts.URL, v20251125, "initialize", map[string]any{
				"protocolVersion": v20251125, "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "raw", "version": "1"},
			}, nil)
			res, _ = out["result"].(map[string]any)
			if status != http.StatusOK || res == nil || res["protocolVersion"] != v20251125 {
				t.Fatalf("initialize at %s: HTTP %d, %v", v20251125, status, out)
			}
			caps, _ = res["capabilities"].(map[string]any)
			wantCapability(t, "initialize", caps)

			if opts != nil && opts.Capabilities != nil && opts.Capabilities.Experimental["x.y/z"] != nil {
				// The server's own entries stay.
				exp, _ := caps["experimental"].(map[string]any)
				ext, _ := caps["extensions"].(map[string]any)
				if exp["x.y/z"] == nil || ext["x.y/e"] == nil {
					t.Errorf("capabilities = %v, lost the server's own experimental or extension", caps)
				}
			}
		})
	}
}

// The go-sdk client sees the capability as its typed capabilities carry
// it, at 2026-07-28 (server/discover) and 2025-11-25 (initialize).
func TestGoSDKClientSeesTheCapability(t *testing.T) {
	server := mcp.NewServer(&mcp.Implementation{Name: "wire-test", Version: "1"}, nil)
	server.AddReceivingMiddleware(mcpwire.AdvertiseIdempotency)
	addEcho(server)
	ts := httptest.NewServer(mcpwire.HTTPHandler(server, mcpwire.HTTPLimits{}))
	defer ts.Close()
	for _, version := range []string{v20260728, v20251125} {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(),
			&mcp.StreamableClientTransport{Endpoint: ts.URL, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: version})
		if err != nil {
			t.Fatalf("%s: %v", version, err)
		}
		init := cs.InitializeResult()
		if init.ProtocolVersion != version {
			t.Errorf("negotiated %s, want %s", init.ProtocolVersion, version)
		}
		want := map[string]any{"metaKey": mcpwire.MetaKey, "param": mcpwire.ParamKey}
		if c := init.Capabilities; c == nil || !reflect.DeepEqual(c.Extensions[mcpwire.CapabilityName], want) || !reflect.DeepEqual(c.Experimental[mcpwire.CapabilityName], want) {
			t.Errorf("%s: capabilities = %+v, want extensions and experimental %s", version, c, mcpwire.CapabilityName)
		}
		_ = cs.Close()
	}
}

// headerRecorder records the headers of every tools/call request.
type headerRecorder struct {
	mu    sync.Mutex
	calls []http.Header
}

func (h *headerRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Header.Get("Mcp-Method") == "tools/call" {
		h.mu.Lock()
		h.calls = append(h.calls, r.Header.Clone())
		h.mu.Unlock()
	}
	return http.DefaultTransport.RoundTrip(r)
}

// A key argument annotated with KeyHeaderAnnotation is a schema the go-sdk
// accepts (AddTool validates x-mcp-header annotations and panics on a bad
// one); its 2026-07-28 client mirrors the argument into
// Mcp-Param-Idempotency-Key, and the server refuses a request whose header
// and argument differ. The key in _meta is mirrored into no header.
func TestKeyHeaderAnnotation(t *testing.T) {
	if got := mcpwire.KeyHeaderAnnotation(); !reflect.DeepEqual(got, map[string]any{"x-mcp-header": mcpwire.KeyHeaderName}) || mcpwire.KeyHeaderName != "Idempotency-Key" {
		t.Fatalf("KeyHeaderAnnotation() = %v", got)
	}
	schema := &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{
		"amount":         {Type: "integer"},
		"idempotencyKey": {Type: "string", Extra: mcpwire.KeyHeaderAnnotation()},
	}}
	var mu sync.Mutex
	var got []string
	server := mcp.NewServer(&mcp.Implementation{Name: "wire-test", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "charge", InputSchema: schema}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var args struct {
			IdempotencyKey string `json:"idempotencyKey"`
		}
		_ = json.Unmarshal(req.Params.Arguments, &args)
		mu.Lock()
		got = append(got, args.IdempotencyKey)
		mu.Unlock()
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
	})
	// The check is live: the SDK refuses the annotation on an object.
	func() {
		defer func() {
			if recover() == nil {
				t.Error("AddTool accepted x-mcp-header on an object property")
			}
		}()
		server.AddTool(&mcp.Tool{Name: "bad", InputSchema: &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{
			"k": {Type: "object", Extra: mcpwire.KeyHeaderAnnotation()},
		}}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) { return nil, nil })
	}()
	ts := httptest.NewServer(mcpwire.HTTPHandler(server, mcpwire.HTTPLimits{}))
	defer ts.Close()

	rec := &headerRecorder{}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: ts.URL, MaxRetries: -1, HTTPClient: &http.Client{Transport: rec}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if v := cs.InitializeResult().ProtocolVersion; v != v20260728 {
		t.Fatalf("negotiated %s, want %s", v, v20260728)
	}
	if _, err := cs.ListTools(context.Background(), nil); err != nil { // the client mirrors only tools it listed
		t.Fatal(err)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge",
		Arguments: map[string]any{"amount": 5, "idempotencyKey": "arg-key-1"}, Meta: mcp.Meta{mcpwire.MetaKey: "meta-key-1"}})
	if err != nil || res.IsError {
		t.Fatalf("call: %v %+v", err, res)
	}
	rec.mu.Lock()
	calls := rec.calls
	rec.mu.Unlock()
	if len(calls) != 1 || calls[0].Get("Mcp-Param-Idempotency-Key") != "arg-key-1" {
		t.Fatalf("tools/call headers = %v, want Mcp-Param-Idempotency-Key: arg-key-1", calls)
	}
	for name, values := range calls[0] {
		for _, v := range values {
			if strings.Contains(v, "meta-key-1") {
				t.Errorf("the _meta key is mirrored into the header %s", name)
			}
		}
	}

	// A header that differs from the argument is refused before the tool.
	status, out := rawRPC(t, ts.URL, v20260728, "tools/call", map[string]any{
		"name": "charge", "arguments": map[string]any{"amount": 5, "idempotencyKey": "arg-key-2"},
	}, http.Header{"Mcp-Param-Idempotency-Key": {"other"}})
	e, _ := out["error"].(map[string]any)
	if status != http.StatusBadRequest || e["code"] != float64(mcp.CodeHeaderMismatch) {
		t.Errorf("mismatched header: HTTP %d, %v; want 400 and %d", status, out, mcp.CodeHeaderMismatch)
	}
	mu.Lock()
	defer mu.Unlock()
	if !reflect.DeepEqual(got, []string{"arg-key-1"}) {
		t.Errorf("the tool ran with keys %q, want only arg-key-1", got)
	}
}

// A tools/call answered in middleware (as mcpgate answers refusals and
// replays) carries resultType "complete" at 2026-07-28, which a client of
// that version requires, and none before; a tool handler's result has it
// from the SDK either way.
func TestMarkComplete(t *testing.T) {
	server := mcp.NewServer(&mcp.Implementation{Name: "wire-test", Version: "1"}, nil)
	addEcho(server)
	server.AddReceivingMiddleware(mcpwire.MarkComplete, func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if call, ok := req.(*mcp.CallToolRequest); ok && call.Params.Name == "refused" {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "no"}}}, nil
			}
			return next(ctx, method, req)
		}
	})
	ts := httptest.NewServer(mcpwire.HTTPHandler(server, mcpwire.HTTPLimits{}))
	defer ts.Close()
	for _, version := range []string{v20260728, v20251125} {
		for _, tool := range []string{"refused", "echo"} {
			_, out := rawRPC(t, ts.URL, version, "tools/call", map[string]any{"name": tool, "arguments": map[string]any{}}, nil)
			res, _ := out["result"].(map[string]any)
			want := map[string]any{v20260728: "complete", v20251125: nil}[version]
			if res == nil || res["resultType"] != want {
				t.Errorf("%s at %s: %v, want resultType %v", tool, version, out, want)
			}
		}
	}
}

package mcpbridge_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/mcpwire"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// wire records the raw result of every tools/call response read over HTTP.
type wire struct {
	mu      sync.Mutex
	results []json.RawMessage
}

func (w *wire) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil || !bytes.Contains(body, []byte(`"tools/call"`)) {
		return resp, err
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var msg struct {
			Result json.RawMessage `json:"result"`
		}
		if json.Unmarshal([]byte(strings.TrimPrefix(sc.Text(), "data: ")), &msg) == nil && msg.Result != nil {
			w.mu.Lock()
			w.results = append(w.results, msg.Result)
			w.mu.Unlock()
		}
	}
	return resp, nil
}

// last returns the member name of the last tools/call result, as its bytes.
func (w *wire) last(t *testing.T, name string) json.RawMessage {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.results) == 0 {
		t.Fatal("no tools/call result on the wire")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(w.results[len(w.results)-1], &m); err != nil {
		t.Fatal(err)
	}
	return m[name]
}

// The bridge served by HTTPHandler (as idemgate-mcp -listen serves it):
// the go-sdk client at 2026-07-28 (server/discover, no session) and pinned
// to 2025-11-25 (initialize, each POST on its own temporary session) sees
// the capability in extensions and experimental; a charge runs once per
// key, and its replay has the same bytes of text and structuredContent and
// is marked replayed; a keyless call is refused IDEMPOTENCY_KEY_MISSING with
// text for the model that names the _meta carrier, and advice fix_request.
func TestStatelessHTTPAtEachProtocolVersion(t *testing.T) {
	ledger := &payments.Ledger{}
	stack := stacktest.StartEmbedded(t, func(s *grpc.Server) {
		paymentsv1.RegisterPaymentsServiceServer(s, &payments.Server{Ledger: ledger})
		reflection.Register(s)
	}, stacktest.Config{})
	files, err := mcpbridge.LoadReflection(context.Background(), stack.Tool)
	if err != nil {
		t.Fatal(err)
	}
	server, err := mcpbridge.New(mcpbridge.Config{Conn: stack.Tool, Files: files, CallTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mcpbridge.HTTPHandler(server, mcpwire.HTTPLimits{}))
	t.Cleanup(srv.Close)
	for _, version := range []string{"2026-07-28", "2025-11-25"} {
		t.Run(version, func(t *testing.T) {
			w := &wire{}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(),
				&mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1, HTTPClient: &http.Client{Transport: w}},
				&mcp.ClientSessionOptions{ProtocolVersion: version})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			init := cs.InitializeResult()
			if init.ProtocolVersion != version {
				t.Fatalf("negotiated %s, want %s", init.ProtocolVersion, version)
			}
			want := map[string]any{"metaKey": mcpbridge.MetaKey, "param": mcpbridge.ParamKey}
			if c := init.Capabilities; c == nil || !reflect.DeepEqual(c.Extensions[mcpbridge.CapabilityName], want) || !reflect.DeepEqual(c.Experimental[mcpbridge.CapabilityName], want) {
				t.Errorf("capabilities = %+v, want %s in extensions and experimental", c, mcpbridge.CapabilityName)
			}

			customer := "cust_" + version
			first := charge(t, cs, "order-"+version, customer)
			firstText, firstStructured := w.last(t, "content"), w.last(t, "structuredContent")
			second := charge(t, cs, "order-"+version, customer)
			if first.IsError || replayed(first) || !replayed(second) {
				t.Fatalf("first %+v, second %+v: want a run, then its replay", first, second)
			}
			if !bytes.Equal(firstText, w.last(t, "content")) || !bytes.Equal(firstStructured, w.last(t, "structuredContent")) || len(firstStructured) == 0 {
				t.Errorf("replay differs: %s %s, then %s %s", firstText, firstStructured, w.last(t, "content"), w.last(t, "structuredContent"))
			}
			if charges, _ := ledger.Executions(customer); charges != 1 {
				t.Errorf("charged %d times, want once", charges)
			}

			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{
				Name: chargeTool, Arguments: map[string]any{"customerId": customer, "amountCents": 1},
			})
			if err != nil {
				t.Fatal(err)
			}
			e := errMeta(res)
			if !res.IsError || e["reason"] != idemgate.ReasonKeyMissing || e["advice"] != mcpbridge.AdviceFixRequest {
				t.Fatalf("keyless = %+v, want %s with advice %s", res, idemgate.ReasonKeyMissing, mcpbridge.AdviceFixRequest)
			}
			text := res.Content[0].(*mcp.TextContent).Text
			for _, s := range []string{"IDEMPOTENCY_KEY_MISSING", "needs an idempotency key", `_meta["` + mcpbridge.MetaKey + `"]`, "(fix_request)"} {
				if !strings.Contains(text, s) {
					t.Errorf("refusal text %q lacks %q", text, s)
				}
			}
			if charges, _ := ledger.Executions(customer); charges != 1 {
				t.Errorf("charged %d times after the refusal, want once", charges)
			}
		})
	}
}

func replayed(res *mcp.CallToolResult) bool {
	v, _ := res.Meta[mcpbridge.MetaReplayed].(bool)
	return v
}

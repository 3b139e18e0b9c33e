package mcptest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/mcpbridge"
)

// commandFor is bin with args, its stderr in a file the test log shows when
// the test fails.
func commandFor(t *testing.T, bin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, args...)
	logPath := filepath.Join(t.TempDir(), filepath.Base(bin)+".stderr")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("stderr of %s:\n%s", filepath.Base(bin), b)
		}
	})
	cmd.Stderr = f
	return cmd
}

func call(t *testing.T, s *mcp.ClientSession, name, key string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	if key != "" {
		p.Meta = mcp.Meta{mcpbridge.MetaKey: key}
	}
	res, err := s.CallTool(context.Background(), p)
	if err != nil {
		t.Fatalf("CallTool %s: %v", name, err)
	}
	return res
}

func ok(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %s", text(res))
	}
	m, _ := res.StructuredContent.(map[string]any)
	if m == nil {
		t.Fatalf("no structured content: %+v", res)
	}
	return m
}

func text(res *mcp.CallToolResult) string {
	if len(res.Content) == 0 {
		return ""
	}
	tc, _ := res.Content[0].(*mcp.TextContent)
	if tc == nil {
		return ""
	}
	return tc.Text
}

func replayed(res *mcp.CallToolResult) bool {
	v, _ := res.Meta[mcpbridge.MetaReplayed].(bool)
	return v
}

func reason(res *mcp.CallToolResult) string {
	e, _ := res.Meta[mcpbridge.MetaError].(map[string]any)
	r, _ := e["reason"].(string)
	return r
}

// The go-sdk client, over stdio and streamable HTTP, through the bridge
// binary to the real payments-server and dedupesvc binaries. Unpinned, it
// asks for its latest version, 2026-07-28, which the bridge serves on both.
func TestGoSDKClient(t *testing.T) {
	s := startStack(t)
	for _, tr := range transports() {
		t.Run(tr.name, func(t *testing.T) {
			session := connectGo(t, s, tr)
			cust := "cust_go_" + tr.name

			t.Run("negotiates 2026-07-28 and sees the capability", func(t *testing.T) {
				init := session.InitializeResult()
				want := map[string]any{"metaKey": mcpbridge.MetaKey, "param": mcpbridge.ParamKey}
				if init.ProtocolVersion != protocol2026 {
					t.Errorf("negotiated %s, want %s", init.ProtocolVersion, protocol2026)
				}
				if c := init.Capabilities; c == nil || !reflect.DeepEqual(c.Extensions[mcpbridge.CapabilityName], want) || !reflect.DeepEqual(c.Experimental[mcpbridge.CapabilityName], want) {
					t.Errorf("capabilities = %+v, want %s in extensions and experimental", c, mcpbridge.CapabilityName)
				}
			})

			t.Run("lists the payments service with schemas and annotations", func(t *testing.T) {
				res, err := session.ListTools(context.Background(), nil)
				if err != nil {
					t.Fatal(err)
				}
				tools := map[string]*mcp.Tool{}
				for _, tool := range res.Tools {
					tools[tool.Name] = tool
				}
				if len(tools) != 3 || tools[chargeTool] == nil || tools[receiptTool] == nil || tools[balanceTool] == nil {
					t.Fatalf("tools = %v, want ChargeCard, SendReceipt, GetBalance", keys(tools))
				}
				charge := tools[chargeTool]
				if a := charge.Annotations; a == nil || a.ReadOnlyHint || a.IdempotentHint || a.DestructiveHint == nil || !*a.DestructiveHint {
					t.Errorf("ChargeCard annotations = %+v, want destructive, neither idempotent (without its key) nor read-only", a)
				}
				if a := tools[balanceTool].Annotations; a == nil || !a.ReadOnlyHint {
					t.Errorf("GetBalance annotations = %+v, want read-only", a)
				}
				wantSchema := map[string]any{
					"type":                 "object",
					"additionalProperties": false,
					"properties": map[string]any{
						"customerId": map[string]any{"type": "string"},
						"amountCents": map[string]any{"anyOf": []any{
							map[string]any{"type": "integer"},
							map[string]any{"type": "string", "pattern": "^-?[0-9]+$"},
						}},
					},
				}
				if got := roundTrip(t, charge.InputSchema); !reflect.DeepEqual(got, wantSchema) {
					t.Errorf("ChargeCard input schema = %s", mustJSON(got))
				}
				if charge.OutputSchema == nil {
					t.Error("ChargeCard has no output schema")
				} else if got := roundTrip(t, charge.OutputSchema).(map[string]any)["properties"].(map[string]any)["amountCents"]; !reflect.DeepEqual(got, map[string]any{"type": "integer"}) {
					t.Errorf("ChargeCard output schema's amountCents = %s, want an integer (results write 64-bit integers as numbers)", mustJSON(got))
				}
			})

			t.Run("a charge called twice with one key runs once and the second is a replay", func(t *testing.T) {
				args := map[string]any{"customerId": cust, "amountCents": 4200}
				first := call(t, session, chargeTool, "order-1-"+tr.name, args)
				second := call(t, session, chargeTool, "order-1-"+tr.name, args)
				if replayed(first) || !replayed(second) {
					t.Errorf("replayed = %v then %v, want false then true", replayed(first), replayed(second))
				}
				if !reflect.DeepEqual(ok(t, first), ok(t, second)) || text(first) != text(second) {
					t.Errorf("replay differs: %s vs %s", text(first), text(second))
				}
				if !strings.Contains(text(first), `"amountCents":4200`) || ok(t, first)["amountCents"] != float64(4200) {
					t.Errorf("charge = %s, want amountCents the number 4200", text(first))
				}
				bal := ok(t, call(t, session, balanceTool, "", map[string]any{"customerId": cust}))
				if bal["charges"] != float64(1) { // a JSON number, not protojson's string
					t.Errorf("balance = %v, want one charge", bal)
				}
			})

			t.Run("concurrent duplicates run once", func(t *testing.T) {
				c := cust + "_concurrent"
				var wg sync.WaitGroup
				results := make([]*mcp.CallToolResult, 8)
				for i := range results {
					wg.Go(func() {
						res, err := session.CallTool(context.Background(), &mcp.CallToolParams{
							Name: chargeTool, Arguments: map[string]any{"customerId": c, "amountCents": "700"},
							Meta: mcp.Meta{mcpbridge.MetaKey: "order-2-" + tr.name},
						})
						if err != nil {
							t.Error(err)
							return
						}
						results[i] = res
					})
				}
				wg.Wait()
				var chargeIDs = map[any]int{}
				for _, res := range results {
					if res == nil {
						continue
					}
					if res.IsError {
						// A duplicate that outwaited max_wait gets IN_FLIGHT; its
						// retry gets the outcome.
						if reason(res) != idemgate.ReasonInFlight {
							t.Errorf("concurrent duplicate: %s", text(res))
						}
						continue
					}
					chargeIDs[ok(t, res)["chargeId"]]++
				}
				if len(chargeIDs) != 1 {
					t.Errorf("charge ids = %v, want one", chargeIDs)
				}
				bal := ok(t, call(t, session, balanceTool, "", map[string]any{"customerId": c}))
				if bal["charges"] != float64(1) { // a JSON number, not protojson's string
					t.Errorf("balance = %v, want one charge", bal)
				}
			})

			t.Run("a key reused with other arguments is refused", func(t *testing.T) {
				call(t, session, chargeTool, "order-3-"+tr.name, map[string]any{"customerId": cust, "amountCents": 100})
				res := call(t, session, chargeTool, "order-3-"+tr.name, map[string]any{"customerId": cust, "amountCents": 999})
				if !res.IsError || reason(res) != idemgate.ReasonKeyReused {
					t.Errorf("reuse = %s (meta %v), want %s", text(res), res.Meta, idemgate.ReasonKeyReused)
				}
				if e := res.Meta[mcpbridge.MetaError].(map[string]any); e["code"] != "FAILED_PRECONDITION" || e["advice"] != mcpbridge.AdviceEscalate {
					t.Errorf("error meta = %v", e)
				}
			})

			t.Run("a keyless call to a gated tool is refused with the reason", func(t *testing.T) {
				res := call(t, session, chargeTool, "", map[string]any{"customerId": cust, "amountCents": 100})
				if !res.IsError || reason(res) != idemgate.ReasonKeyMissing {
					t.Errorf("keyless = %s, want %s", text(res), idemgate.ReasonKeyMissing)
				}
			})

			t.Run("a read-only tool needs no key", func(t *testing.T) {
				res := call(t, session, balanceTool, "", map[string]any{"customerId": "nobody"})
				ok(t, res)
				if replayed(res) {
					t.Error("an ungated read says replayed")
				}
			})

			t.Run("invalid arguments are refused before the tool server", func(t *testing.T) {
				res := call(t, session, chargeTool, "order-4-"+tr.name, map[string]any{"customerId": cust, "amount": 1})
				if !res.IsError || reason(res) != mcpbridge.ReasonArgumentsInvalid {
					t.Errorf("bad arguments = %s", text(res))
				}
			})
		})
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func roundTrip(t *testing.T, v any) any {
	t.Helper()
	var out any
	if err := json.Unmarshal([]byte(mustJSON(v)), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

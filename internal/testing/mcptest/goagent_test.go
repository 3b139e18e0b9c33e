package mcptest

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/mcpgate"
)

const goAgentPkg = "github.com/idemgate/idemgate/examples/mcp-go-agent"

// The Go agent example (the Go SDK's client; charges keyed by the order,
// carried in the argument charge_card's schema marks as the key) against the
// native server gated by mcpgate (examples/mcp-server), both real binaries:
// over stdio, the agent starting the server with its Dedupe service in
// process on the embedded store; over streamable HTTP, the server on the
// real dedupesvc binary on PostgreSQL, as make run-postgres and make
// run-mcp-server run them.
func TestGoAgentExampleNativeServer(t *testing.T) {
	agent := proctest.Build(t, goAgentPkg)
	server := proctest.Build(t, nativeServerPkg)
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			customer := "cust_goagent_" + mode
			orderA, orderB := "ord_go_"+mode+"_a", "ord_go_"+mode+"_b"
			conversation := "conv-go-" + mode
			args := []string{"-conversation", conversation, "-customer", customer, "-orders", orderA + ":4200," + orderB + ":1500"}
			var endpoint string
			if mode == "stdio" {
				args = append(args, "--", server, "-data-dir", filepath.Join(t.TempDir(), "data"))
			} else {
				dedupeAddr := stacktest.FreeAddr(t)
				proctest.Start(t, proctest.Build(t, dedupePkg),
					[]string{"-listen", dedupeAddr, "-database-url", pgtest.SchemaURL(t), "-metrics-listen="},
					[]string{"IDEMGATE_TOKEN_FILE="}).WaitTCP(t, dedupeAddr, startTimeout)
				addr := stacktest.FreeAddr(t)
				proctest.Start(t, server, []string{"-dedupe", dedupeAddr, "-listen", addr}, []string{"IDEMGATE_DEDUPE_TOKEN="}).WaitTCP(t, addr, startTimeout)
				endpoint = "http://" + addr + "/mcp"
				args = append(args, "-http", endpoint)
			}
			cmd := commandFor(t, agent, args...)
			var stdout bytes.Buffer
			cmd.Stdout = &stdout
			if err := cmd.Run(); err != nil {
				t.Fatalf("mcp-go-agent: %v\n%s", err, stdout.String())
			}
			checkGoAgent(t, &stdout, conversation, orderA, orderB)

			if mode == "http" {
				// The server's own count, read by another client: two orders,
				// two charges.
				session := connectNative(t, endpoint)
				res, err := session.CallTool(context.Background(), &mcp.CallToolParams{Name: "get_balance", Arguments: map[string]any{"customerId": customer}})
				if err != nil {
					t.Fatal(err)
				}
				if bal, _ := res.StructuredContent.(map[string]any); res.IsError || !wantInt(bal["charges"], 2) {
					t.Errorf("get_balance = %+v, want 2 charges", res.StructuredContent)
				}
			}
		})
	}
}

// connectNative connects the go-sdk client to a server's HTTP endpoint.
func connectNative(t *testing.T, endpoint string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	session, err := mcp.NewClient(&mcp.Implementation{Name: "mcptest", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = session.Close() })
	return session
}

// checkGoAgent checks what examples/mcp-go-agent printed. Order A's charge:
// its answer lost, the runtime's retry of the same tool call (same
// tool-call id, same key) gets the replay; the model's re-emission is a new
// tool call with a new tool-call id and another note (left out of the
// fingerprint), keyed by the order, and gets the same replay; every charge
// sent carries its key in orderId, the schema-marked argument; the explain
// line names the tool-call-id key it did not use. Order B is charged under
// its own key; a charge naming an order id the model made up is not sent;
// order A's charge with another amount is refused with
// IDEMPOTENCY_KEY_REUSED, advice escalate; the balance shows two charges,
// with two charge ids: each order charged exactly once.
func checkGoAgent(t *testing.T, stdout *bytes.Buffer, conversation, orderA, orderB string) {
	t.Helper()
	printed := stdout.String()
	lines := readAgentLines(t, stdout)
	if len(lines) != 9 {
		t.Fatalf("the agent printed %d lines, want 9:\n%s", len(lines), printed)
	}
	if lines[0].KeyArgument != "orderId" {
		t.Errorf("key argument = %q, want orderId (the schema's mark)", lines[0].KeyArgument)
	}
	lost, retry, reemit, explain, second, madeUp, reused, balance := lines[1], lines[2], lines[3], lines[4], lines[5], lines[6], lines[7], lines[8]

	ids := map[string]bool{}
	for _, l := range []agentLine{lost, reemit, second, madeUp, reused, balance} {
		if l.ToolCallID == "" || ids[l.ToolCallID] {
			t.Errorf("tool-call id %q: want a new one for every call the model emits\n%s", l.ToolCallID, printed)
		}
		ids[l.ToolCallID] = true
	}
	if retry.ToolCallID != lost.ToolCallID {
		t.Errorf("the runtime's retry has tool-call id %q, want the lost call's %q", retry.ToolCallID, lost.ToolCallID)
	}
	for _, l := range []agentLine{lost, retry, reemit, second, reused, balance} {
		if l.Sent == nil || !*l.Sent {
			t.Errorf("%s %q was not sent", l.Tool, l.Note)
		}
	}

	if lost.Key != orderA || retry.Key != orderA || reemit.Key != orderA || reused.Key != orderA {
		t.Errorf("keys = %q %q %q %q, want order A's %q", lost.Key, retry.Key, reemit.Key, reused.Key, orderA)
	}
	if lost.IsError || lost.Replayed || retry.IsError || !retry.Replayed || reemit.IsError || !reemit.Replayed {
		t.Errorf("order A: lost %+v, retry %+v, re-emit %+v: want one run, then replays marked _meta[%q]", lost, retry, reemit, mcpgate.MetaReplayed)
	}
	for _, l := range []agentLine{lost, retry, reemit, second, reused} {
		if l.Arguments["orderId"] != l.Key {
			t.Errorf("%s %q sent orderId %v under the key %q, want the key in the schema-marked argument", l.Tool, l.Note, l.Arguments["orderId"], l.Key)
		}
	}
	if reemit.Arguments["note"] == lost.Arguments["note"] {
		t.Errorf("the re-emitted charge has the note %v, want another one (left out of the fingerprint)", reemit.Arguments["note"])
	}
	if !sameAnswer(lost, retry) || !sameAnswer(lost, reemit) {
		t.Errorf("replays differ from the run:\n%s\n%s\n%s", lost.Text, retry.Text, reemit.Text)
	}
	if explain.Explain == "" || explain.ToolCallIDKey != conversation+"/"+reemit.ToolCallID || explain.ActionKey != orderA {
		t.Errorf("explain = %+v, want the re-emitted call's tool-call-id key %q and the action key %q", explain, conversation+"/"+reemit.ToolCallID, orderA)
	}
	if second.Key != orderB || second.IsError || second.Replayed {
		t.Errorf("order B = %+v, want a run under %q", second, orderB)
	}
	chargeA, chargeB := lost.Structured["chargeId"], second.Structured["chargeId"]
	if chargeA == nil || chargeB == nil || chargeA == chargeB {
		t.Errorf("charge ids %v and %v, want one per order", chargeA, chargeB)
	}
	if madeUp.Sent == nil || *madeUp.Sent || !madeUp.IsError || madeUp.Key != "" {
		t.Errorf("made-up order id = %+v, want not sent", madeUp)
	}
	if !reused.IsError || reused.Reason != idemgate.ReasonKeyReused || reused.Advice != mcpbridge.AdviceEscalate {
		t.Errorf("key reused = %+v, want %s with advice %s", reused, idemgate.ReasonKeyReused, mcpbridge.AdviceEscalate)
	}
	if balance.Key != "" || balance.IsError || !wantInt(balance.Structured["charges"], 2) {
		t.Errorf("balance = %+v, want two charges, read without a key", balance)
	}
}

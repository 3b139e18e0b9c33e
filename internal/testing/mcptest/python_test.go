package mcptest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/mcpbridge"
)

// agentLine is one line an agent example prints: its capabilities, a tool
// call, or the explanation of what a tool-call-id key would have done.
type agentLine struct {
	Capabilities map[string]any `json:"capabilities"`
	KeyArgument  string         `json:"keyArgument"` // the Go agent's only
	ToolCallID   string         `json:"toolCallId"`
	Tool         string         `json:"tool"`
	Key          string         `json:"key"`
	Note         string         `json:"note"`
	IsError      bool           `json:"isError"`
	Reason       string         `json:"reason"`
	Advice       string         `json:"advice"`
	Replayed     bool           `json:"replayed"`
	Structured   map[string]any `json:"structured"`
	Text         string         `json:"text"`
	Sent         *bool          `json:"sent"`      // the Go agent's only
	Arguments    map[string]any `json:"arguments"` // the Go agent's only

	Explain       string `json:"explain"`
	ToolCallIDKey string `json:"toolCallIdKey"`
	ActionKey     string `json:"actionKey"`
}

// readAgentLines parses what an agent example printed, one JSON object a
// line.
func readAgentLines(t *testing.T, stdout *bytes.Buffer) []agentLine {
	t.Helper()
	printed := stdout.String()
	var lines []agentLine
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		var l agentLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("the agent printed %q: %v\n%s", sc.Text(), err, printed)
		}
		lines = append(lines, l)
	}
	return lines
}

// intOf reads a JSON integer printed as a number or, as protojson prints a
// 64-bit one, as a string.
func intOf(v any) (int64, bool) {
	switch v := v.(type) {
	case float64:
		return int64(v), v == float64(int64(v))
	case json.Number:
		n, err := v.Int64()
		return n, err == nil
	}
	return 0, false
}

// wantInt reports whether v is the integer want, as a JSON number (the
// bridge writes 64-bit integers as numbers; a string is not the integer).
func wantInt(v any, want int64) bool {
	n, ok := intOf(v)
	return ok && n == want
}

// sameAnswer reports whether a replay is the run's answer: the same
// structured content and the same text.
func sameAnswer(run, replay agentLine) bool {
	return replay.Structured != nil && reflect.DeepEqual(run.Structured, replay.Structured) && run.Text == replay.Text
}

// The stdlib-only Python agent example, over stdio and streamable HTTP, with
// the key in _meta and as SEP-3182's idempotencyKey parameter: raw JSON-RPC,
// so this is also the wire-level test of both carriers and of the
// tools.idempotency capability.
func TestPythonAgentExample(t *testing.T) {
	python := require(t, "python3", "install Python 3.8 or later")
	agent, _ := filepath.Abs(filepath.Join("..", "..", "..", "examples", "mcp-python-agent", "agent.py"))
	s := startStack(t)
	for _, mode := range []string{"stdio", "http"} {
		for _, carrier := range []string{"meta", "param"} {
			t.Run(mode+"/"+carrier, func(t *testing.T) {
				run := mode + "-" + carrier
				args := []string{agent, "--conversation", "conv-" + run, "--order", "ord_py_" + run, "--customer", "cust_py_" + run, "--carrier", carrier}
				if mode == "stdio" {
					args = append(append(args, "--stdio", s.bridgeBin), s.bridgeArgs()...)
				} else {
					args = append(args, "--http", s.startHTTPBridge(t))
				}
				cmd := commandFor(t, python, args...)
				var stdout bytes.Buffer
				cmd.Stdout = &stdout
				if err := cmd.Run(); err != nil {
					t.Fatalf("agent.py: %v\n%s", err, stdout.String())
				}
				checkAgent(t, &stdout, "conv-"+run, "ord_py_"+run, true)
			})
		}
	}
}

// checkAgent checks what an agent example through the bridge printed. The
// charge of the order: its answer lost, the runtime's retry of the same
// tool call (same tool-call id, same key) gets the replay; the model's
// re-emission is a new tool call with a new tool-call id, keyed by the action
// (order/<order>/charge), and gets the same replay; the explain line names
// the tool-call-id key it did not use. The receipt ran under the receipt's
// action key; the charge re-emitted with another amount was refused with
// IDEMPOTENCY_KEY_REUSED, advice escalate; the balance shows one charge and
// one receipt. rawCapabilities: the client shows the raw capabilities (an
// SDK strips tools.idempotency).
func checkAgent(t *testing.T, stdout *bytes.Buffer, conversation, order string, rawCapabilities bool) {
	t.Helper()
	printed := stdout.String()
	lines := readAgentLines(t, stdout)
	if len(lines) != 8 {
		t.Fatalf("the agent printed %d lines, want 8:\n%s", len(lines), printed)
	}
	if rawCapabilities {
		tools, _ := lines[0].Capabilities["tools"].(map[string]any)
		if _, ok := tools["idempotency"]; !ok {
			t.Errorf("capabilities = %v, want tools.idempotency (SEP-3182)", lines[0].Capabilities)
		}
	}
	lost, retry, reemit, explain, receipt, reused, balance := lines[1], lines[2], lines[3], lines[4], lines[5], lines[6], lines[7]

	// Every tool call the model emitted has its own id; the runtime's retry
	// resent the lost one.
	ids := map[string]bool{}
	for _, l := range []agentLine{lost, reemit, receipt, reused, balance} {
		if l.ToolCallID == "" || ids[l.ToolCallID] {
			t.Errorf("tool-call id %q: want a new one for every call the model emits\n%s", l.ToolCallID, printed)
		}
		ids[l.ToolCallID] = true
	}
	if retry.ToolCallID != lost.ToolCallID {
		t.Errorf("the runtime's retry has tool-call id %q, want the lost call's %q", retry.ToolCallID, lost.ToolCallID)
	}

	chargeKey := "order/" + order + "/charge"
	if lost.Key != chargeKey || retry.Key != chargeKey || reemit.Key != chargeKey || reused.Key != chargeKey {
		t.Errorf("keys = %q %q %q %q, want the action's %q", lost.Key, retry.Key, reemit.Key, reused.Key, chargeKey)
	}
	if lost.IsError || lost.Replayed || retry.IsError || !retry.Replayed || reemit.IsError || !reemit.Replayed {
		t.Errorf("charge: lost %+v, retry %+v, re-emit %+v: want one run, then replays", lost, retry, reemit)
	}
	if !sameAnswer(lost, retry) || !sameAnswer(lost, reemit) {
		t.Errorf("replays differ from the run:\n%s\n%s\n%s", lost.Text, retry.Text, reemit.Text)
	}
	if explain.Explain == "" || explain.ToolCallIDKey != conversation+"/"+reemit.ToolCallID || explain.ActionKey != chargeKey {
		t.Errorf("explain = %+v, want the re-emitted call's tool-call-id key %q and the action key %q", explain, conversation+"/"+reemit.ToolCallID, chargeKey)
	}
	if receipt.Key != "order/"+order+"/receipt" || receipt.IsError || receipt.Replayed {
		t.Errorf("receipt = %+v, want a run under order/%s/receipt", receipt, order)
	}
	if !reused.IsError || reused.Reason != interceptor.ReasonKeyReused || reused.Advice != mcpbridge.AdviceEscalate {
		t.Errorf("key reused = %+v, want %s with advice %s", reused, interceptor.ReasonKeyReused, mcpbridge.AdviceEscalate)
	}
	if balance.Key != "" || balance.IsError || !wantInt(balance.Structured["charges"], 1) || !wantInt(balance.Structured["receipts"], 1) {
		t.Errorf("balance = %+v, want one charge and one receipt, read without a key", balance)
	}
}

package mcptest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/mcpbridge"
)

// agentLine is one line examples/mcp-python-agent/agent.py prints.
type agentLine struct {
	Capabilities map[string]any `json:"capabilities"`
	ToolCallID   string         `json:"toolCallId"`
	Tool         string         `json:"tool"`
	Key          string         `json:"key"`
	Note         string         `json:"note"`
	IsError      bool           `json:"isError"`
	Reason       string         `json:"reason"`
	Advice       string         `json:"advice"`
	Replayed     bool           `json:"replayed"`
	Structured   map[string]any `json:"structured"`
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
				args := []string{agent, "--conversation", "conv-" + run, "--customer", "cust_py_" + run, "--carrier", carrier}
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
				checkAgent(t, &stdout, "conv-"+run, true)
			})
		}
	}
}

// checkAgent checks what an agent example printed: the charge ran once under
// the tool call's key and every retry got its replay; the receipt ran; a key
// reused for another action was refused with advice escalate; the balance
// shows one charge and one receipt. rawCapabilities: the client shows the
// raw capabilities (an SDK strips tools.idempotency).
func checkAgent(t *testing.T, stdout *bytes.Buffer, conversation string, rawCapabilities bool) {
	t.Helper()
	printed := stdout.String()
	var lines []agentLine
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var l agentLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("the agent printed %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	if len(lines) != 7 {
		t.Fatalf("the agent printed %d lines, want 7:\n%s", len(lines), printed)
	}
	if rawCapabilities {
		tools, _ := lines[0].Capabilities["tools"].(map[string]any)
		if _, ok := tools["idempotency"]; !ok {
			t.Errorf("capabilities = %v, want tools.idempotency (SEP-3182)", lines[0].Capabilities)
		}
	}
	lost, retry, reemit, receipt, reused, balance := lines[1], lines[2], lines[3], lines[4], lines[5], lines[6]
	wantKey := conversation + "/call_7QXf2"
	if lost.Key != wantKey || retry.Key != wantKey || reemit.Key != wantKey {
		t.Errorf("keys = %q %q %q, want the tool call's %q", lost.Key, retry.Key, reemit.Key, wantKey)
	}
	if lost.IsError || lost.Replayed || !retry.Replayed || !reemit.Replayed {
		t.Errorf("charge: lost %+v, retry %+v, re-emit %+v: want one run, then replays", lost, retry, reemit)
	}
	if retry.Structured["chargeId"] != lost.Structured["chargeId"] || reemit.Structured["chargeId"] != lost.Structured["chargeId"] {
		t.Errorf("charge ids %v %v %v, want one", lost.Structured["chargeId"], retry.Structured["chargeId"], reemit.Structured["chargeId"])
	}
	if receipt.IsError || receipt.Replayed {
		t.Errorf("receipt = %+v", receipt)
	}
	if !reused.IsError || reused.Reason != interceptor.ReasonKeyReused || reused.Advice != mcpbridge.AdviceEscalate {
		t.Errorf("key reused = %+v, want %s with advice %s", reused, interceptor.ReasonKeyReused, mcpbridge.AdviceEscalate)
	}
	if balance.IsError || balance.Structured["charges"] != float64(1) || balance.Structured["receipts"] != float64(1) {
		t.Errorf("balance = %+v, want one charge and one receipt", balance.Structured)
	}
}

package mcptest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/mcpbridge"
)

// require returns the path of the program name, or ends the test: a failure
// under CI=true (.ci/run installs every dependency, so a missing one is a
// broken CI), a skip elsewhere.
func require(t *testing.T, name, hint string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		missing(t, name+" is not installed: "+hint)
	}
	return path
}

func missing(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// requireNodeModules checks that npm ci ran in dir.
func requireNodeModules(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		missing(t, "the npm packages are not installed: run npm ci in "+dir)
	}
}

// toolResult is a CallToolResult as the TypeScript SDK returned it.
type toolResult struct {
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StructuredContent map[string]any `json:"structuredContent"`
	IsError           bool           `json:"isError"`
	Meta              map[string]any `json:"_meta"`
}

func (r toolResult) replayed() bool { v, _ := r.Meta[mcpbridge.MetaReplayed].(bool); return v }

func (r toolResult) reason() string {
	e, _ := r.Meta[mcpbridge.MetaError].(map[string]any)
	s, _ := e["reason"].(string)
	return s
}

func (r toolResult) text() string {
	if len(r.Content) == 0 {
		return ""
	}
	return r.Content[0].Text
}

// The official TypeScript SDK's Client, over stdio and streamable HTTP,
// through the bridge binary to the real payments-server and dedupesvc.
func TestTypeScriptSDKClient(t *testing.T) {
	node := require(t, "node", "install Node.js 18 or later")
	dir, _ := filepath.Abs("node")
	requireNodeModules(t, dir)
	s := startStack(t)
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			args := []string{filepath.Join(dir, "client.mjs"), mode}
			if mode == "stdio" {
				args = append(append(args, s.bridgeBin), s.bridgeArgs()...)
			} else {
				args = append(args, s.startHTTPBridge(t))
			}
			cmd := commandFor(t, node, args...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "MCPTEST_RUN="+mode)
			var stdout bytes.Buffer
			cmd.Stdout = &stdout
			if err := cmd.Run(); err != nil {
				t.Fatalf("node client.mjs %s: %v\n%s", mode, err, stdout.String())
			}
			var out struct {
				ProtocolVersion string         `json:"protocolVersion"`
				Capabilities    map[string]any `json:"capabilities"`
				Tools           []struct {
					Name        string         `json:"name"`
					InputSchema map[string]any `json:"inputSchema"`
					Annotations map[string]any `json:"annotations"`
				} `json:"tools"`
				First, Second, Reuse, Keyless, SepFirst, SepSecond, Balance toolResult
				Concurrent                                                  []toolResult
			}
			if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
				t.Fatalf("client.mjs printed %q: %v", stdout.String(), err)
			}
			// The SDK's latest version; the server answers its initialize with it.
			if out.ProtocolVersion != "2025-11-25" {
				t.Errorf("negotiated %q, want 2025-11-25", out.ProtocolVersion)
			}

			// The SDK's capability schema keeps experimental members but strips
			// tools.idempotency (TestRawJSONRPC sees that one on the wire).
			experimental, _ := out.Capabilities["experimental"].(map[string]any)
			if _, ok := experimental[mcpbridge.CapabilityName]; !ok {
				t.Errorf("capabilities = %v, want experimental %s", out.Capabilities, mcpbridge.CapabilityName)
			}
			annotations := map[string]map[string]any{}
			for _, tool := range out.Tools {
				annotations[tool.Name] = tool.Annotations
			}
			if a := annotations[chargeTool]; a["idempotentHint"] != false || a["readOnlyHint"] != false || a["destructiveHint"] != true {
				t.Errorf("ChargeCard annotations = %v", a)
			}
			if a := annotations[balanceTool]; a["readOnlyHint"] != true {
				t.Errorf("GetBalance annotations = %v", a)
			}

			if out.First.IsError || out.First.replayed() || !out.Second.replayed() {
				t.Errorf("first = %+v, second = %+v: want a run, then its replay", out.First, out.Second)
			}
			if !reflect.DeepEqual(out.First.StructuredContent, out.Second.StructuredContent) || out.First.text() != out.Second.text() {
				t.Errorf("replay differs: %s vs %s", out.First.text(), out.Second.text())
			}
			ids := map[any]bool{}
			for _, r := range out.Concurrent {
				if r.IsError {
					if r.reason() != idemgate.ReasonInFlight {
						t.Errorf("concurrent duplicate: %s", r.text())
					}
					continue
				}
				ids[r.StructuredContent["chargeId"]] = true
			}
			if len(ids) != 1 {
				t.Errorf("concurrent duplicates got charges %v, want one", ids)
			}
			if !out.Reuse.IsError || out.Reuse.reason() != idemgate.ReasonKeyReused {
				t.Errorf("reuse = %+v, want %s", out.Reuse, idemgate.ReasonKeyReused)
			}
			if !out.Keyless.IsError || out.Keyless.reason() != idemgate.ReasonKeyMissing {
				t.Errorf("keyless = %+v, want %s", out.Keyless, idemgate.ReasonKeyMissing)
			}
			// SEP-3182's parameter: the TypeScript SDK sends extra params, and
			// the bridge's carriers hand them to the handler.
			if out.SepFirst.IsError || out.SepFirst.replayed() || !out.SepSecond.replayed() ||
				out.SepFirst.StructuredContent["chargeId"] != out.SepSecond.StructuredContent["chargeId"] {
				t.Errorf("idempotencyKey parameter: first = %+v, second = %+v", out.SepFirst, out.SepSecond)
			}
			// order-1, order-2 and order-3 each charged once.
			if c := out.Balance.StructuredContent["charges"]; !wantInt(c, 3) {
				t.Errorf("balance = %v, want 3 charges", out.Balance.StructuredContent)
			}
		})
	}
}

// The TypeScript agent example (the official SDK's Client; side effects
// keyed by the action, so the model's re-emitted charge, a new tool call,
// gets the replay), over stdio and streamable HTTP.
func TestTypeScriptAgentExample(t *testing.T) {
	node := require(t, "node", "install Node.js 18 or later")
	dir, _ := filepath.Abs(filepath.Join("..", "..", "..", "examples", "mcp-typescript-agent"))
	requireNodeModules(t, dir)
	s := startStack(t)
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			args := []string{filepath.Join(dir, "agent.mjs"), "--conversation", "conv-ts-" + mode, "--order", "ord_ts_" + mode, "--customer", "cust_tsagent_" + mode}
			if mode == "stdio" {
				args = append(append(args, "--stdio", s.bridgeBin), s.bridgeArgs()...)
			} else {
				args = append(args, "--http", s.startHTTPBridge(t))
			}
			cmd := commandFor(t, node, args...)
			cmd.Dir = dir
			var stdout bytes.Buffer
			cmd.Stdout = &stdout
			if err := cmd.Run(); err != nil {
				t.Fatalf("agent.mjs: %v\n%s", err, stdout.String())
			}
			checkAgent(t, &stdout, "conv-ts-"+mode, "ord_ts_"+mode, false)
		})
	}
}

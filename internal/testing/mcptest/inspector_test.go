package mcptest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// inspector runs the MCP Inspector's CLI (mcp-inspector --cli, from
// inspector/node_modules) against target at the protocol era ("legacy":
// initialize, up to 2025-11-25; "modern": server/discover, 2026-07-28) and
// returns the result it printed.
func inspector(t *testing.T, target []string, era string, args ...string) toolResult {
	t.Helper()
	node := require(t, "node", "install Node.js 18 or later")
	dir, _ := filepath.Abs("inspector")
	bin := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "inspector", "clients", "launcher", "build", "index.js")
	if _, err := os.Stat(bin); err != nil {
		missing(t, "the MCP Inspector is not installed: run npm ci in "+dir+" (make npm-ci)")
	}
	// The target comes first: the Inspector's repeatable options would take
	// it as their values.
	cmdArgs := append(append([]string{bin, "--cli"}, target...), append([]string{"--protocol-era", era, "--format", "json", "-q"}, args...)...)
	cmd := commandFor(t, node, cmdArgs...)
	cmd.Dir = dir
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	// A tool result with isError exits non-zero; the result is on stdout.
	_ = cmd.Run()
	var out struct {
		Result toolResult `json:"result"`
		Error  any        `json:"error"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || (out.Error != nil && !out.Result.IsError) {
		t.Fatalf("mcp-inspector %v printed %q (%v)", args, stdout.String(), err)
	}
	return out.Result
}

// The MCP Inspector's CLI (2.12.0), a client nobody here wrote, at both
// protocol eras, against the bridge binary and the native mcpgate server,
// over stdio and streamable HTTP: a charge runs once per key, the replay's
// content and structured content are the first answer's and marked
// replayed, a keyless call is refused with the model's text and the
// machine-readable advice, and the balance counts one charge per key.
func TestInspectorCLI(t *testing.T) {
	s := startStack(t)
	native := proctest.Build(t, nativeServerPkg)
	type server struct {
		name            string
		target          func(t *testing.T) []string
		charge, balance string
		// oneProcess is false where the Inspector starts the server on
		// each run (native over stdio): its ledger starts empty each time,
		// while the gate's records persist in its data directory, so a
		// replay there comes from a record an earlier process stored.
		oneProcess bool
	}
	servers := []server{
		{"bridge/stdio", func(t *testing.T) []string { return append([]string{s.bridgeBin}, s.bridgeArgs()...) }, chargeTool, balanceTool, true},
		{"bridge/http", func(t *testing.T) []string { return []string{s.startHTTPBridge(t)} }, chargeTool, balanceTool, true},
		{"native/stdio", func(t *testing.T) []string {
			return []string{native, "-data-dir", filepath.Join(t.TempDir(), "data")}
		}, "charge_card", "get_balance", false},
		{"native/http", func(t *testing.T) []string {
			addr := stacktest.FreeAddr(t)
			proctest.Start(t, native, []string{"-data-dir", filepath.Join(t.TempDir(), "data"), "-listen", addr}, nil).WaitTCP(t, addr, startTimeout)
			return []string{"http://" + addr + "/mcp"}
		}, "charge_card", "get_balance", true},
	}
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			// One server for both eras: over stdio the Inspector starts it on
			// each run, on its own embedded store per subtest.
			target := srv.target(t)
			for _, era := range []string{"legacy", "modern"} {
				// The bridges share one tool server: keys and customers are
				// this subtest's own.
				prefix := srv.name + "/" + era
				customer := "cust_insp_" + prefix
				call := func(key string) toolResult {
					args := []string{"--method", "tools/call", "--tool-name", srv.charge,
						"--tool-args-json", fmt.Sprintf(`{"customerId":%q,"amountCents":1250}`, customer)}
					if key != "" {
						args = append(args, "--tool-metadata", mcpbridge.MetaKey+"="+key)
					}
					return inspector(t, target, era, args...)
				}
				first, second := call(prefix+"-1"), call(prefix+"-1")
				if first.IsError || first.replayed() || !second.replayed() {
					t.Errorf("%s: first %+v, second %+v: want a run, then its replay", era, first, second)
				}
				if first.text() != second.text() || !reflect.DeepEqual(first.StructuredContent, second.StructuredContent) {
					t.Errorf("%s: the replay %s differs from the first answer %s", era, second.text(), first.text())
				}
				if other := call(prefix + "-2"); other.IsError || other.replayed() || (srv.oneProcess && other.text() == first.text()) {
					t.Errorf("%s: a second key: %+v, want a new charge", era, other)
				}
				keyless := call("")
				e, _ := keyless.Meta[mcpbridge.MetaError].(map[string]any)
				if !keyless.IsError || keyless.reason() != "IDEMPOTENCY_KEY_MISSING" || e["advice"] != mcpbridge.AdviceFixRequest ||
					!bytes.Contains([]byte(keyless.text()), []byte(mcpbridge.MetaKey)) {
					t.Errorf("%s: keyless: %+v, want IDEMPOTENCY_KEY_MISSING naming the carrier, advice fix_request", era, keyless)
				}
				if !srv.oneProcess {
					continue
				}
				balance := inspector(t, target, era, "--method", "tools/call", "--tool-name", srv.balance,
					"--tool-args-json", fmt.Sprintf(`{"customerId":%q}`, customer))
				if balance.IsError || !wantInt(balance.StructuredContent["charges"], 2) {
					t.Errorf("%s: balance %+v, want 2 charges (two keys, one sent twice)", era, balance)
				}
			}
		})
	}
}

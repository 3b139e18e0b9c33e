package mcptest

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/mcpgate"
)

const nativeServerPkg = "github.com/idemgate/idemgate/examples/mcp-server"

// The official TypeScript SDK's Client, over stdio and streamable HTTP,
// against the native Go MCP server gated by mcpgate (examples/mcp-server;
// over stdio with its Dedupe service in process on the embedded store, over
// HTTP on the real dedupesvc binary): the same script and the same promises
// as through the bridge.
func TestTypeScriptSDKClientNativeServer(t *testing.T) {
	node := require(t, "node", "install Node.js 18 or later")
	dir, _ := filepath.Abs("node")
	requireNodeModules(t, dir)
	bin := proctest.Build(t, nativeServerPkg)
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			args := []string{filepath.Join(dir, "client.mjs"), mode}
			dataDir := filepath.Join(t.TempDir(), "data")
			if mode == "stdio" {
				args = append(args, bin, "-data-dir", dataDir)
			} else {
				// Over HTTP, on the real dedupesvc binary, as make
				// run-mcp-server runs it.
				dedupeAddr := stacktest.FreeAddr(t)
				proctest.Start(t, proctest.Build(t, dedupePkg),
					[]string{"-listen", dedupeAddr, "-data-dir", dataDir, "-metrics-listen", stacktest.FreeAddr(t)},
					[]string{"DATABASE_URL="}).WaitTCP(t, dedupeAddr, startTimeout)
				addr := stacktest.FreeAddr(t)
				proctest.Start(t, bin, []string{"-dedupe", dedupeAddr, "-listen", addr}, nil).WaitTCP(t, addr, startTimeout)
				args = append(args, "http://"+addr+"/mcp")
			}
			cmd := commandFor(t, node, args...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "MCPTEST_RUN="+mode, "MCPTEST_CHARGE_TOOL=charge_card", "MCPTEST_BALANCE_TOOL=get_balance")
			var stdout bytes.Buffer
			cmd.Stdout = &stdout
			if err := cmd.Run(); err != nil {
				t.Fatalf("node client.mjs %s: %v\n%s", mode, err, stdout.String())
			}
			var out struct {
				ProtocolVersion                                             string         `json:"protocolVersion"`
				Capabilities                                                map[string]any `json:"capabilities"`
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
			if experimental, _ := out.Capabilities["experimental"].(map[string]any); experimental[mcpgate.CapabilityName] == nil {
				t.Errorf("capabilities = %v, want experimental %s", out.Capabilities, mcpgate.CapabilityName)
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

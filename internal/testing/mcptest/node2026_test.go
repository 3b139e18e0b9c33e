package mcptest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// protocol2026 is the stateless protocol version the TypeScript v2 client
// is pinned to.
const protocol2026 = "2026-07-28"

// The official TypeScript SDK v2 client (@modelcontextprotocol/client),
// pinned to protocol version 2026-07-28 (server/discover, no initialize, no
// fallback), over stdio and stateless streamable HTTP, against the real
// idemgate-mcp binary (in front of the real payments-server and dedupesvc)
// and the native mcpgate example server (examples/mcp-server): it
// negotiates 2026-07-28, sees the capability, charges once per key, gets a
// replay identical to the first answer and marked replayed, gets the same
// with SEP-3182's idempotencyKey parameter, and is refused a reused key and a
// keyless call.
func TestTypeScriptV2Client2026(t *testing.T) {
	node := require(t, "node", "install Node.js 20 or later")
	// The v2 client's packages need Node.js 20 (their engines field).
	if v, err := exec.Command(node, "-p", "process.versions.node.split('.')[0]").Output(); err != nil {
		t.Fatalf("node -p: %v", err)
	} else if major, _ := strconv.Atoi(strings.TrimSpace(string(v))); major < 20 {
		missing(t, "@modelcontextprotocol/client needs Node.js 20 or later; node is "+strings.TrimSpace(string(v)))
	}
	dir, _ := filepath.Abs("node")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "client", "package.json")); err != nil {
		missing(t, "the npm packages are not installed: run npm ci in "+dir)
	}
	s := startStack(t)
	native := proctest.Build(t, nativeServerPkg)
	type server struct {
		name string
		// args returns the script's arguments after its mode.
		args    func(t *testing.T, mode string) []string
		env     []string
		charges any // the balance's charges: order-1, order-2 and order-3
	}
	servers := []server{
		{name: "bridge", args: func(t *testing.T, mode string) []string {
			if mode == "stdio" {
				return append([]string{s.bridgeBin}, s.bridgeArgs()...)
			}
			return []string{s.startHTTPBridge(t)}
		}, charges: float64(3)},
		{name: "native", args: func(t *testing.T, mode string) []string {
			dataDir := filepath.Join(t.TempDir(), "data")
			if mode == "stdio" {
				return []string{native, "-data-dir", dataDir}
			}
			dedupeAddr := stacktest.FreeAddr(t)
			proctest.Start(t, proctest.Build(t, dedupePkg),
				[]string{"-listen", dedupeAddr, "-data-dir", dataDir, "-metrics-listen", stacktest.FreeAddr(t)},
				[]string{"DATABASE_URL="}).WaitTCP(t, dedupeAddr, startTimeout)
			addr := stacktest.FreeAddr(t)
			proctest.Start(t, native, []string{"-dedupe", dedupeAddr, "-listen", addr}, nil).WaitTCP(t, addr, startTimeout)
			return []string{"http://" + addr + "/mcp"}
		}, env: []string{"MCPTEST_CHARGE_TOOL=charge_card", "MCPTEST_BALANCE_TOOL=get_balance"}, charges: float64(3)},
	}
	for _, srv := range servers {
		for _, mode := range []string{"stdio", "http"} {
			t.Run(srv.name+"/"+mode, func(t *testing.T) {
				run := srv.name + "-" + mode
				cmd := commandFor(t, node, append([]string{filepath.Join(dir, "client2026.mjs"), mode}, srv.args(t, mode)...)...)
				cmd.Dir = dir
				cmd.Env = append(append(os.Environ(), "MCPTEST_RUN="+run), srv.env...)
				var stdout bytes.Buffer
				cmd.Stdout = &stdout
				if err := cmd.Run(); err != nil {
					t.Fatalf("node client2026.mjs %s: %v\n%s", mode, err, stdout.String())
				}
				var out struct {
					ProtocolVersion string         `json:"protocolVersion"`
					Era             string         `json:"era"`
					Capabilities    map[string]any `json:"capabilities"`
					Discover        struct {
						SupportedVersions []string       `json:"supportedVersions"`
						Capabilities      map[string]any `json:"capabilities"`
					} `json:"discover"`
					First, Second, Reuse, Keyless, SepFirst, SepSecond, Balance toolResult
					Concurrent                                                  []toolResult
					Wire                                                        []string `json:"wire"`
				}
				if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
					t.Fatalf("client2026.mjs printed %q: %v", stdout.String(), err)
				}
				if out.ProtocolVersion != protocol2026 || out.Era != "modern" || !slices.Contains(out.Discover.SupportedVersions, protocol2026) {
					t.Fatalf("negotiated %q (era %q, server supports %v), want %s", out.ProtocolVersion, out.Era, out.Discover.SupportedVersions, protocol2026)
				}
				// The v2 client's typed capabilities keep extensions and
				// experimental; its schema strips SEP-3182's tools.idempotency.
				want := map[string]any{"metaKey": mcpbridge.MetaKey, "param": mcpbridge.ParamKey}
				for where, caps := range map[string]map[string]any{"getServerCapabilities": out.Capabilities, "getDiscoverResult": out.Discover.Capabilities} {
					for _, member := range []string{"extensions", "experimental"} {
						m, _ := caps[member].(map[string]any)
						if !reflect.DeepEqual(m[mcpbridge.CapabilityName], want) {
							t.Errorf("%s: %s[%s] = %v, want %v", where, member, mcpbridge.CapabilityName, m[mcpbridge.CapabilityName], want)
						}
					}
				}

				if out.First.IsError || out.First.replayed() || !out.Second.replayed() {
					t.Errorf("first = %+v, second = %+v: want a run, then its replay", out.First, out.Second)
				}
				if !reflect.DeepEqual(out.First.StructuredContent, out.Second.StructuredContent) || out.First.text() != out.Second.text() || out.First.text() == "" {
					t.Errorf("replay differs: %s vs %s", out.First.text(), out.Second.text())
				}
				if mode == "http" {
					// The bytes on the wire: the first two tools/call answers.
					if len(out.Wire) < 2 {
						t.Fatalf("wire = %v, want the tools/call answers", out.Wire)
					}
					var raw [2]struct {
						Result map[string]json.RawMessage `json:"result"`
					}
					for i := range raw {
						if err := json.Unmarshal([]byte(out.Wire[i]), &raw[i]); err != nil {
							t.Fatal(err)
						}
					}
					for _, member := range []string{"content", "structuredContent", "resultType"} {
						if a, b := raw[0].Result[member], raw[1].Result[member]; !bytes.Equal(a, b) || len(a) == 0 {
							t.Errorf("%s on the wire: %s, then %s", member, a, b)
						}
					}
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
				e, _ := out.Keyless.Meta[mcpbridge.MetaError].(map[string]any)
				if !out.Keyless.IsError || out.Keyless.reason() != idemgate.ReasonKeyMissing || e["advice"] != mcpbridge.AdviceFixRequest {
					t.Errorf("keyless = %+v, want %s with advice %s", out.Keyless, idemgate.ReasonKeyMissing, mcpbridge.AdviceFixRequest)
				}
				for _, s := range []string{"IDEMPOTENCY_KEY_MISSING", "needs an idempotency key", `_meta["` + mcpbridge.MetaKey + `"]`, "(fix_request)"} {
					if !strings.Contains(out.Keyless.text(), s) {
						t.Errorf("refusal text %q lacks %q", out.Keyless.text(), s)
					}
				}
				// SEP-3182's parameter: the v2 client sends extra params too.
				if out.SepFirst.IsError || out.SepFirst.replayed() || !out.SepSecond.replayed() ||
					out.SepFirst.StructuredContent["chargeId"] != out.SepSecond.StructuredContent["chargeId"] {
					t.Errorf("idempotencyKey parameter: first = %+v, second = %+v", out.SepFirst, out.SepSecond)
				}
				// order-1, order-2 and order-3 each charged once.
				if c := out.Balance.StructuredContent["charges"]; c != srv.charges {
					t.Errorf("balance = %v, want 3 charges", out.Balance.StructuredContent)
				}
			})
		}
	}
}

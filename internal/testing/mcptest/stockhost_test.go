package mcptest

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// hostConfig is the stock-host configuration docs/mcp.md shows: the JSON an MCP host
// (the mcpServers file desktop and IDE hosts read) is given to start the
// bridge over stdio.
type hostConfig struct {
	MCPServers map[string]struct {
		Command string   `json:"command"`
		Args    []string `json:"args"`
	} `json:"mcpServers"`
}

// readmeHostConfig reads the JSON block that follows the
// <!-- stock-host-config --> marker in docs/mcp.md ("Which key carrier a host
// can fill").
func readmeHostConfig(t *testing.T) hostConfig {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "mcp.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- stock-host-config -->\\s*```json\\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatal("docs/mcp.md has no ```json block after <!-- stock-host-config -->")
	}
	var cfg hostConfig
	if err := json.Unmarshal(m[1], &cfg); err != nil {
		t.Fatalf("the host configuration in docs/mcp.md is not JSON: %v", err)
	}
	return cfg
}

// A stock host, configured as docs/mcp.md says (stdio, the bridge started
// by the host, no _meta ever sent), charges once per key the model puts in
// the key argument: the real bridge, payments-server and dedupesvc
// binaries. Only the binary's path, the target and the descriptor set are
// this test's; every other argument is the doc's.
func TestStockHostConfigurationFromTheDocs(t *testing.T) {
	cfg := readmeHostConfig(t)
	server, found := cfg.MCPServers["payments"]
	if !found || server.Command != "idemgate-mcp" {
		t.Fatalf("docs/mcp.md host configuration %+v: want mcpServers.payments running idemgate-mcp", cfg)
	}
	s := startStack(t)
	args := append([]string(nil), server.Args...)
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-target":
			args[i+1] = s.paymentsAddr
		case "-descriptor-set":
			args[i+1] = s.descriptorSet
		}
	}
	session := connectGo(t, s, transport{"stdio", func(t *testing.T, s *stack) mcp.Transport {
		return &mcp.CommandTransport{Command: commandFor(t, s.bridgeBin, args...)}
	}})

	tools, err := session.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var keyArg string
	for _, tool := range tools.Tools {
		if tool.Name != chargeTool {
			continue
		}
		b, _ := json.Marshal(tool.InputSchema)
		var schema struct {
			Properties map[string]map[string]any `json:"properties"`
			Required   []string                  `json:"required"`
		}
		_ = json.Unmarshal(b, &schema)
		for name, p := range schema.Properties {
			if p["io.idemgate/idempotency-key"] == true {
				keyArg = name
			}
		}
		if keyArg == "" || !strings.Contains(strings.Join(schema.Required, ","), keyArg) {
			t.Fatalf("ChargeCard's schema lists no required key argument: %s", b)
		}
	}
	// The model fills every argument the schema asks for, the key among
	// them; the host sends them as they are.
	charge := func(key string) *mcp.CallToolResult {
		return call(t, session, chargeTool, "", map[string]any{"customerId": "cust_host", "amountCents": 1250, keyArg: key})
	}
	first, again := charge("order-8812-charge"), charge("order-8812-charge")
	ok(t, first)
	if replayed(first) || !replayed(again) || text(again) != text(first) {
		t.Fatalf("the same key twice: %s (replayed %v), then %s (replayed %v); want one run and its identical replay",
			text(first), replayed(first), text(again), replayed(again))
	}
	if other := charge("order-8813-charge"); replayed(other) || text(other) == text(first) {
		t.Errorf("a new key: %s (replayed %v), want a new charge", text(other), replayed(other))
	}
	missing := call(t, session, chargeTool, "", map[string]any{"customerId": "cust_host", "amountCents": 1250})
	if reason(missing) != "IDEMPOTENCY_KEY_MISSING" || !strings.Contains(text(missing), keyArg) {
		t.Errorf("no key: %s, want IDEMPOTENCY_KEY_MISSING naming %s", text(missing), keyArg)
	}
	balance := ok(t, call(t, session, balanceTool, "", map[string]any{"customerId": "cust_host"}))
	if !wantInt(balance["charges"], 2) {
		t.Errorf("charges = %v after two keys (one sent twice) and a keyless call, want 2", balance["charges"])
	}
}

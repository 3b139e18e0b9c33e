package mcptest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
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

// The stdlib-only Python agent example against the real idemgate-mcp binary
// (in front of the real payments-server and dedupesvc binaries) and the
// real native server binary gated by mcpgate (examples/mcp-server; over
// stdio with its Dedupe service in process on the embedded store, over HTTP
// on the real dedupesvc binary), over stdio and stateless streamable HTTP,
// at 2026-07-28 (server/discover, the _meta triple on every request, over
// HTTP the MCP-Protocol-Version, Mcp-Method and Mcp-Name headers the server
// checks) and at 2025-11-25 (initialize). Raw JSON-RPC, so this is also the
// wire-level test of the carriers: _meta, SEP-3182's idempotencyKey
// parameter, and the argument a schema marks as the key (the native
// server's orderId; the bridge's -key-argument, mirrored as the
// Mcp-Param-Idempotency-Key header over HTTP at 2026-07-28).
func TestPythonAgentExample(t *testing.T) {
	python := require(t, "python3", "install Python 3.8 or later")
	agent, _ := filepath.Abs(filepath.Join("..", "..", "..", "examples", "mcp-python-agent", "agent.py"))
	s := startStack(t)
	native := proctest.Build(t, nativeServerPkg)
	// One HTTP server of each kind serves every HTTP run; every run pays its
	// own order for its own customer.
	bridgeHTTP := s.startHTTPBridge(t)
	keyArgAddr := stacktest.FreeAddr(t)
	proctest.Start(t, s.bridgeBin, s.bridgeArgs("-listen", keyArgAddr, "-key-argument", "idempotency_key"), nil).WaitTCP(t, keyArgAddr, startTimeout)
	dedupeAddr := stacktest.FreeAddr(t)
	proctest.Start(t, proctest.Build(t, dedupePkg),
		[]string{"-listen", dedupeAddr, "-data-dir", filepath.Join(t.TempDir(), "data"), "-metrics-listen", stacktest.FreeAddr(t)},
		[]string{"DATABASE_URL="}).WaitTCP(t, dedupeAddr, startTimeout)
	nativeAddr := stacktest.FreeAddr(t)
	proctest.Start(t, native, []string{"-dedupe", dedupeAddr, "-listen", nativeAddr}, []string{"IDEMGATE_DEDUPE_TOKEN="}).WaitTCP(t, nativeAddr, startTimeout)

	type run struct {
		server, mode, protocol, carrier string
		keyArgument                     bool // the bridge with -key-argument idempotency_key
	}
	var runs []run
	for _, server := range []string{"bridge", "native"} {
		for _, mode := range []string{"stdio", "http"} {
			for _, protocol := range []string{protocol2026, protocol2025} {
				runs = append(runs, run{server, mode, protocol, "auto", false})
			}
		}
		// SEP-3182's parameter on each server and transport; the native
		// server's _meta carrier (auto picks its orderId).
		runs = append(runs, run{server, "stdio", protocol2025, "param", false}, run{server, "http", protocol2026, "param", false})
	}
	runs = append(runs, run{"native", "http", protocol2026, "meta", false}, run{"native", "stdio", protocol2025, "meta", false},
		run{"bridge", "http", protocol2026, "auto", true}, run{"bridge", "stdio", protocol2026, "argument", true})

	for _, r := range runs {
		name := r.server + "/" + r.mode + "/" + r.protocol + "/" + r.carrier
		if r.keyArgument {
			name += "/key-argument"
		}
		t.Run(name, func(t *testing.T) {
			id := strings.NewReplacer("/", "-", "2026-07-28", "26", "2025-11-25", "25").Replace(name)
			conversation, order := "conv-"+id, "ord_py_"+id
			args := []string{agent, "--protocol", r.protocol, "--conversation", conversation, "--order", order, "--customer", "cust_py_" + id, "--carrier", r.carrier}
			switch {
			case r.server == "bridge" && r.mode == "stdio":
				extra := []string{}
				if r.keyArgument {
					extra = []string{"-key-argument", "idempotency_key"}
				}
				args = append(append(args, "--stdio", s.bridgeBin), s.bridgeArgs(extra...)...)
			case r.server == "bridge" && r.keyArgument:
				args = append(args, "--http", "http://"+keyArgAddr+"/mcp")
			case r.server == "bridge":
				args = append(args, "--http", bridgeHTTP)
			case r.mode == "stdio":
				args = append(args, "--stdio", native, "-data-dir", filepath.Join(t.TempDir(), "data"))
			default:
				args = append(args, "--http", "http://"+nativeAddr+"/mcp")
			}
			cmd := commandFor(t, python, args...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("agent.py: %v\n%s\n%s", err, stdout.String(), stderr.String())
			}
			carrier := r.carrier
			if carrier == "auto" {
				carrier = "meta"
				if r.server == "native" || r.keyArgument {
					carrier = "argument" // the schema marks a key argument
				}
			}
			keyArg := map[string]string{"native": "orderId", "bridge": "idempotency_key"}[r.server]
			checkPythonAgent(t, stdout.Bytes(), r.server, r.protocol, carrier, keyArg)
			if r.server == "bridge" {
				checkAgent(t, &stdout, conversation, order, true)
			} else {
				checkAgentAt(t, &stdout, conversation, order, "", true)
			}
		})
	}
}

// The Python agent against a server that does not offer 2026-07-28: the
// bridge served by the Go SDK's stateful streamable HTTP handler, whose
// server/discover lists only the versions before it. At 2026-07-28 the
// agent refuses to go on (exit 2, the advice to use --protocol 2025-11-25,
// no tools/call sent), as against a stateless server narrowed to the
// versions before it, which refuses server/discover, and against one that
// does not know server/discover; at 2025-11-25 it runs the whole story on the session
// the server returned, and ends it with a DELETE.
func TestPythonAgentOlderServers(t *testing.T) {
	python := require(t, "python3", "install Python 3.8 or later")
	agent, _ := filepath.Abs(filepath.Join("..", "..", "..", "examples", "mcp-python-agent", "agent.py"))
	s := startStack(t)
	conn, err := grpc.NewClient(s.paymentsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	files, err := mcpbridge.LoadDescriptorSet(s.descriptorSet)
	if err != nil {
		t.Fatal(err)
	}
	server, err := mcpbridge.New(mcpbridge.Config{Conn: conn, Files: files})
	if err != nil {
		t.Fatal(err)
	}
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	var mu sync.Mutex
	var seen []string // method, session id, JSON-RPC method
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Method string `json:"method"`
		}
		if r.Body != nil {
			b, _ := io.ReadAll(r.Body)
			_ = json.Unmarshal(b, &body)
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		mu.Lock()
		seen = append(seen, r.Method+" "+r.Header.Get("Mcp-Session-Id")+" "+body.Method)
		mu.Unlock()
		handler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	requests := func() []string {
		mu.Lock()
		defer mu.Unlock()
		defer func() { seen = nil }()
		return seen
	}

	t.Run(protocol2026, func(t *testing.T) {
		cmd := commandFor(t, python, agent, "--protocol", protocol2026, "--order", "ord_py_stateful26", "--customer", "cust_py_stateful26", "--http", srv.URL)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Fatalf("agent.py: %v, want exit status 2\n%s\n%s", err, stdout.String(), stderr.String())
		}
		if stdout.Len() != 0 || !strings.Contains(stderr.String(), "does not offer protocol 2026-07-28") || !strings.Contains(stderr.String(), "--protocol 2025-11-25") {
			t.Errorf("stdout %q, stderr %q: want nothing printed and the advice to use --protocol 2025-11-25", stdout.String(), stderr.String())
		}
		if got := requests(); len(got) != 1 || !strings.HasSuffix(got[0], " server/discover") {
			t.Errorf("requests = %q, want server/discover only", got)
		}
	})
	// A stateless server narrowed to the versions before 2026-07-28 refuses
	// server/discover at 2026-07-28 (-32022): the same exit.
	t.Run("narrowed", func(t *testing.T) {
		narrowed := mcp.NewServer(&mcp.Implementation{Name: "narrowed", Version: "1"}, &mcp.ServerOptions{SupportedProtocolVersions: []string{protocol2025}})
		srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return narrowed }, &mcp.StreamableHTTPOptions{Stateless: true}))
		t.Cleanup(srv.Close)
		cmd := commandFor(t, python, agent, "--http", srv.URL)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || stdout.Len() != 0 ||
			!strings.Contains(stderr.String(), "does not offer protocol 2026-07-28") || !strings.Contains(stderr.String(), "-32022") {
			t.Errorf("agent.py: %v, stdout %q, stderr %q: want exit status 2, the refusal (-32022) and the advice", err, stdout.String(), stderr.String())
		}
	})
	// A server from before 2026-07-28 that knows no server/discover (its
	// answer stubbed here): the same exit.
	t.Run("method-not-found", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req struct {
				ID json.RawMessage `json:"id"`
			}
			_ = json.NewDecoder(r.Body).Decode(&req)
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"Method not found"}}`, req.ID)
		}))
		t.Cleanup(srv.Close)
		cmd := commandFor(t, python, agent, "--http", srv.URL)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || stdout.Len() != 0 ||
			!strings.Contains(stderr.String(), "does not offer protocol 2026-07-28") || !strings.Contains(stderr.String(), "-32601") {
			t.Errorf("agent.py: %v, stdout %q, stderr %q: want exit status 2, the refusal (-32601) and the advice", err, stdout.String(), stderr.String())
		}
	})
	t.Run(protocol2025, func(t *testing.T) {
		cmd := commandFor(t, python, agent, "--protocol", protocol2025, "--conversation", "conv-stateful", "--order", "ord_py_stateful", "--customer", "cust_py_stateful", "--http", srv.URL)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("agent.py: %v\n%s\n%s", err, stdout.String(), stderr.String())
		}
		checkPythonAgent(t, stdout.Bytes(), "bridge", protocol2025, "meta", "")
		checkAgent(t, &stdout, "conv-stateful", "ord_py_stateful", true)
		got := requests()
		if len(got) < 2 || !strings.HasPrefix(got[0], "POST  initialize") || got[len(got)-1] != "DELETE "+strings.Fields(got[1])[1]+" " {
			t.Fatalf("requests = %q, want initialize, then every request on the session, then its DELETE", got)
		}
		session := strings.Fields(got[1])[1]
		for _, r := range got[1 : len(got)-1] {
			if !strings.HasPrefix(r, "POST "+session+" ") {
				t.Errorf("request %q, want it on the session %s", r, session)
			}
		}
	})
}

// protocol2025 is the version before 2026-07-28, negotiated with initialize.
const protocol2025 = "2025-11-25"

// checkPythonAgent checks the Python agent's own lines: the first says which
// server it found in tools/list, the version negotiated (and, at
// 2026-07-28, that server/discover listed it) and the capabilities; every
// tool result at 2026-07-28 is complete (resultType), and none has one
// before; every key went in the carrier asked for, and only there: in the
// argument the schema marks (keyArg), or not among the arguments.
func checkPythonAgent(t *testing.T, printed []byte, server, protocol, carrier, keyArg string) {
	t.Helper()
	var first struct {
		Server            string   `json:"server"`
		ProtocolVersion   string   `json:"protocolVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}
	line, _, _ := bytes.Cut(printed, []byte("\n"))
	if err := json.Unmarshal(line, &first); err != nil {
		t.Fatalf("first line %q: %v", line, err)
	}
	if first.Server != server || first.ProtocolVersion != protocol {
		t.Errorf("first line = %+v, want server %s at %s", first, server, protocol)
	}
	if protocol == protocol2026 && !slices.Contains(first.SupportedVersions, protocol2026) {
		t.Errorf("server/discover listed %v, want %s among them", first.SupportedVersions, protocol2026)
	}
	for _, l := range bytes.Split(bytes.TrimSpace(printed), []byte("\n"))[1:] {
		var call struct {
			ToolCallID string         `json:"toolCallId"`
			Tool       string         `json:"tool"`
			Key        string         `json:"key"`
			Carrier    string         `json:"carrier"`
			Arguments  map[string]any `json:"arguments"`
			ResultType *string        `json:"resultType"`
		}
		if err := json.Unmarshal(l, &call); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if call.ToolCallID == "" {
			continue // the explain line
		}
		if protocol == protocol2026 && (call.ResultType == nil || *call.ResultType != "complete") {
			t.Errorf("%s: resultType %v, want complete at %s", call.Tool, call.ResultType, protocol)
		} else if protocol != protocol2026 && call.ResultType != nil {
			t.Errorf("%s: resultType %q before %s", call.Tool, *call.ResultType, protocol2026)
		}
		if call.Key == "" {
			continue
		}
		if call.Carrier != carrier {
			t.Errorf("%s: carrier %q, want %q", call.Tool, call.Carrier, carrier)
		}
		if carrier == "argument" && call.Arguments[keyArg] != call.Key {
			t.Errorf("%s: arguments %v, want the key %q in %s", call.Tool, call.Arguments, call.Key, keyArg)
		} else if _, ok := call.Arguments[keyArg]; carrier != "argument" && keyArg != "" && ok {
			t.Errorf("%s: arguments %v, want no %s with the key in %s", call.Tool, call.Arguments, keyArg, carrier)
		}
	}
}

// checkAgent checks what an agent example through the bridge printed: the
// order's charge under order/<order>/charge, its receipt under
// order/<order>/receipt (checkAgentAt).
func checkAgent(t *testing.T, stdout *bytes.Buffer, conversation, order string, rawCapabilities bool) {
	t.Helper()
	checkAgentAt(t, stdout, conversation, "order/"+order+"/charge", "order/"+order+"/receipt", rawCapabilities)
}

// checkAgentAt checks what an agent example printed. The charge of the
// order: its answer lost, the runtime's retry of the same tool call (same
// tool-call id, same key) gets the replay; the model's re-emission is a new
// tool call with a new tool-call id, keyed by the action (chargeKey), and
// gets the same replay; the explain line names the tool-call-id key it did
// not use. The receipt ran under receiptKey (none: the server has no receipt
// tool, and the agent skipped it); the charge re-emitted with another amount
// was refused with IDEMPOTENCY_KEY_REUSED, advice escalate; the balance,
// read without a key, shows one charge (and one receipt). rawCapabilities:
// the client shows the raw capabilities (an SDK strips tools.idempotency).
func checkAgentAt(t *testing.T, stdout *bytes.Buffer, conversation, chargeKey, receiptKey string, rawCapabilities bool) {
	t.Helper()
	printed := stdout.String()
	lines := readAgentLines(t, stdout)
	want := 8
	if receiptKey == "" {
		want = 7
	}
	if len(lines) != want {
		t.Fatalf("the agent printed %d lines, want %d:\n%s", len(lines), want, printed)
	}
	if rawCapabilities {
		tools, _ := lines[0].Capabilities["tools"].(map[string]any)
		if _, ok := tools["idempotency"]; !ok {
			t.Errorf("capabilities = %v, want tools.idempotency (SEP-3182)", lines[0].Capabilities)
		}
	}
	lost, retry, reemit, explain := lines[1], lines[2], lines[3], lines[4]
	var receipt agentLine
	rest := lines[5:]
	if receiptKey != "" {
		receipt, rest = rest[0], rest[1:]
	}
	reused, balance := rest[0], rest[1]

	// Every tool call the model emitted has its own id; the runtime's retry
	// resent the lost one.
	ids := map[string]bool{}
	emitted := []agentLine{lost, reemit, reused, balance}
	if receiptKey != "" {
		emitted = append(emitted, receipt)
	}
	for _, l := range emitted {
		if l.ToolCallID == "" || ids[l.ToolCallID] {
			t.Errorf("tool-call id %q: want a new one for every call the model emits\n%s", l.ToolCallID, printed)
		}
		ids[l.ToolCallID] = true
	}
	if retry.ToolCallID != lost.ToolCallID {
		t.Errorf("the runtime's retry has tool-call id %q, want the lost call's %q", retry.ToolCallID, lost.ToolCallID)
	}

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
	if receiptKey != "" && (receipt.Key != receiptKey || receipt.IsError || receipt.Replayed) {
		t.Errorf("receipt = %+v, want a run under %s", receipt, receiptKey)
	}
	if !reused.IsError || reused.Reason != idemgate.ReasonKeyReused || reused.Advice != mcpbridge.AdviceEscalate {
		t.Errorf("key reused = %+v, want %s with advice %s", reused, idemgate.ReasonKeyReused, mcpbridge.AdviceEscalate)
	}
	receipts, hasReceipts := balance.Structured["receipts"]
	if balance.Key != "" || balance.IsError || !wantInt(balance.Structured["charges"], 1) ||
		(receiptKey != "" && !wantInt(receipts, 1)) || (receiptKey == "" && hasReceipts) {
		t.Errorf("balance = %+v, want one charge (and one receipt if sent), read without a key", balance)
	}
}

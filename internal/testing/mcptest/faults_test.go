package mcptest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/testing/chaos"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

const (
	chaosToolPkg = "github.com/idemgate/idemgate/internal/testing/chaos/cmd/chaos-tool"
	// The chaos tool's methods: 6s lease, 2s max_wait; Charge fails closed,
	// ChargeReexecute is taken over when its holder's lease runs out.
	failClosedTool = "idemgate.testing.v1.ChaosService.Charge"
	reexecuteTool  = "idemgate.testing.v1.ChaosService.ChargeReexecute"
)

// faultStack is the real dedupesvc binary and the chaos suite's tool server
// (chaos-tool), whose handler stalls between its side effect and its return
// for keys matching -pause-keys, and records each side effect, fsynced, in a
// ledger.
type faultStack struct {
	dedupeAddr, toolAddr, ledger, descriptorSet, bridgeBin, toolBin string
}

func startFaultStack(t *testing.T) *faultStack {
	t.Helper()
	dir := t.TempDir()
	s := &faultStack{
		dedupeAddr: stacktest.FreeAddr(t), toolAddr: stacktest.FreeAddr(t),
		ledger: filepath.Join(dir, "ledger.jsonl"), descriptorSet: filepath.Join(dir, "chaos.binpb"),
		bridgeBin: proctest.Build(t, bridgePkg), toolBin: proctest.Build(t, chaosToolPkg),
	}
	proctest.Start(t, proctest.Build(t, dedupePkg),
		[]string{"-listen", s.dedupeAddr, "-data-dir", filepath.Join(dir, "data"), "-metrics-listen", stacktest.FreeAddr(t)},
		[]string{"DATABASE_URL="}).WaitTCP(t, s.dedupeAddr, startTimeout)
	b, err := proto.Marshal(mcpbridge.FileSet(testingv1.File_idemgate_testing_v1_chaos_proto))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.descriptorSet, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// startTool starts (or restarts, on the same address and ledger) the tool.
func (s *faultStack) startTool(t *testing.T, pauseKeys string, pauseFor time.Duration) *proctest.Process {
	t.Helper()
	args := []string{"-listen", s.toolAddr, "-dedupe", s.dedupeAddr, "-ledger", s.ledger, "-latency", "1ms"}
	if pauseKeys != "" {
		args = append(args, "-pause-keys", pauseKeys, "-pause-for", pauseFor.String())
	}
	p := proctest.Start(t, s.toolBin, args, nil)
	p.WaitTCP(t, s.toolAddr, startTimeout)
	return p
}

// connect starts a bridge over streamable HTTP and connects the go-sdk
// client to it.
func (s *faultStack) connect(t *testing.T, callTimeout time.Duration) *mcp.ClientSession {
	t.Helper()
	addr := stacktest.FreeAddr(t)
	proctest.Start(t, s.bridgeBin, []string{"-target", s.toolAddr, "-plaintext", "-descriptor-set", s.descriptorSet,
		"-listen", addr, "-call-timeout", callTimeout.String()}, nil).WaitTCP(t, addr, startTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	session, err := mcp.NewClient(&mcp.Implementation{Name: "mcptest-faults", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = session.Close() })
	return session
}

// effects counts the side effects the ledger holds for key.
func (s *faultStack) effects(t *testing.T, key string) int {
	t.Helper()
	entries, _, err := chaos.ReadLedger(s.ledger)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.Key == key && e.Event == chaos.EventEffect {
			n++
		}
	}
	return n
}

func chaosCall(ctx context.Context, session *mcp.ClientSession, tool, key string) (*mcp.CallToolResult, error) {
	return session.CallTool(ctx, &mcp.CallToolParams{
		Name: tool, Arguments: map[string]any{"action": key, "amountCents": "100"},
		Meta: mcp.Meta{mcpbridge.MetaKey: key},
	})
}

// giveUpAfterTheEffect calls until the tool has run key's side effect, each
// call given up (its context cancelled, or the bridge's deadline) while the
// handler stalls. A call that gives up before it reached the tool is the
// same action: the next one, with the same key, starts it.
func (s *faultStack) giveUpAfterTheEffect(t *testing.T, session *mcp.ClientSession, tool, key string) {
	t.Helper()
	for s.effects(t, key) == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		res, err := chaosCall(ctx, session, tool, key)
		cancel()
		if err == nil && (!res.IsError || errorField(res, "advice") != mcpbridge.AdviceRetrySameKey) {
			t.Fatalf("a call while the handler stalls = %+v %s", res.Meta, text(res))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func errorField(res *mcp.CallToolResult, name string) any {
	e, _ := res.Meta[mcpbridge.MetaError].(map[string]any)
	return e[name]
}

// retryUntil retries key as an agent runtime does, with the same key after
// each retry_same_key refusal, and returns the first result with other
// advice, and the reasons it retried on.
func retryUntil(t *testing.T, session *mcp.ClientSession, tool, key string) (*mcp.CallToolResult, []string) {
	t.Helper()
	var seen []string
	for {
		res, err := chaosCall(context.Background(), session, tool, key)
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		if !res.IsError || errorField(res, "advice") != mcpbridge.AdviceRetrySameKey {
			return res, seen
		}
		r, _ := errorField(res, "reason").(string)
		if r == "" {
			r, _ = errorField(res, "code").(string)
		}
		seen = append(seen, r)
		delay := 200 * time.Millisecond
		if s, ok := errorField(res, "retryAfterSeconds").(float64); ok && s > 0 {
			delay = time.Duration(s * float64(time.Second))
		}
		time.Sleep(delay)
	}
}

// A caller gives up while the charge runs; its retries through the bridge
// with the same key are told to retry (IDEMPOTENCY_IN_FLIGHT while the
// handler stalls) and then get the replay: one side effect.
func TestCallerGivesUpThenTheRetryGetsTheReplay(t *testing.T) {
	s := startFaultStack(t)
	s.startTool(t, "^slow-", 4*time.Second)
	session := s.connect(t, time.Minute)

	const key = "slow-1"
	s.giveUpAfterTheEffect(t, session, failClosedTool, key)
	res, retried := retryUntil(t, session, failClosedTool, key)
	t.Logf("retried on %v", retried)
	if res.IsError || !replayed(res) {
		t.Fatalf("the retry = %s %+v, want the replay", text(res), res.Meta)
	}
	if n := s.effects(t, key); n != 1 {
		t.Errorf("side effects = %d, want 1", n)
	}
}

// The tool server is killed after its side effect, before it stored the
// outcome. Through the bridge, the retry with the same key gets what each
// policy promises: FAIL_CLOSED answers IDEMPOTENCY_OUTCOME_UNKNOWN (advice
// escalate) and never runs it again; REEXECUTE runs it again once the lease
// is out.
func TestToolKilledAfterItsSideEffect(t *testing.T) {
	s := startFaultStack(t)
	tool := s.startTool(t, "^kill-", 10*time.Minute)
	session := s.connect(t, time.Second)

	s.giveUpAfterTheEffect(t, session, failClosedTool, "kill-closed")
	s.giveUpAfterTheEffect(t, session, reexecuteTool, "kill-reexecute")
	tool.Kill()
	s.startTool(t, "", 0)

	res, retried := retryUntil(t, session, failClosedTool, "kill-closed")
	t.Logf("FAIL_CLOSED: retried on %v", retried)
	if !res.IsError || errorField(res, "reason") != idemgate.ReasonOutcomeUnknown || errorField(res, "advice") != mcpbridge.AdviceEscalate {
		t.Errorf("FAIL_CLOSED retry = %s %+v, want %s with advice %s", text(res), res.Meta, idemgate.ReasonOutcomeUnknown, mcpbridge.AdviceEscalate)
	}
	if n := s.effects(t, "kill-closed"); n != 1 {
		t.Errorf("FAIL_CLOSED side effects = %d, want 1", n)
	}

	res, retried = retryUntil(t, session, reexecuteTool, "kill-reexecute")
	t.Logf("REEXECUTE: retried on %v", retried)
	if res.IsError || replayed(res) {
		t.Errorf("REEXECUTE retry = %s %+v, want a new run", text(res), res.Meta)
	}
	if n := s.effects(t, "kill-reexecute"); n != 2 {
		t.Errorf("REEXECUTE side effects = %d, want 2 (the killed run, and the run that took over)", n)
	}
	// And once stored, it replays.
	again, _ := retryUntil(t, session, reexecuteTool, "kill-reexecute")
	if again.IsError || !replayed(again) || text(again) != text(res) {
		t.Errorf("after the takeover = %s %+v, want the replay of %s", text(again), again.Meta, text(res))
	}
}

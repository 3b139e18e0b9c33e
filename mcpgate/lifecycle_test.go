package mcpgate_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/testlog"
	"github.com/idemgate/idemgate/mcpgate"
)

// What every gate gets from the core: marks on a tool's error, a
// reconciler, after-reply and the Dedupe service's health.

// provider is a tool's downstream: it charges once per call, or fails as
// told, and honours its context as a production provider client does.
type provider struct {
	runs atomic.Int64
	// fail, when set, is what the next charges fail with.
	fail func(ctx context.Context) error
}

func (p *provider) charge(ctx context.Context) (string, error) {
	n := p.runs.Add(1)
	if p.fail != nil {
		if err := p.fail(ctx); err != nil {
			return "", err
		}
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	return fmt.Sprintf("ch_%d", n), nil
}

// markedServer is a server with one gated tool, "pay", that calls p.
func markedServer(p *provider) *mcp.Server {
	server := mcp.NewServer(&mcp.Implementation{Name: "marks-test", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "pay", Annotations: &mcp.ToolAnnotations{}},
		func(ctx context.Context, _ *mcp.CallToolRequest, in chargeIn) (*mcp.CallToolResult, chargeOut, error) {
			id, err := p.charge(ctx)
			if err != nil {
				return nil, chargeOut{}, err
			}
			return nil, chargeOut{ChargeID: id, Customer: in.Customer, Amount: in.Amount}, nil
		})
	return server
}

func markedFixture(t *testing.T, p *provider, policy mcpgate.ToolPolicy, opts ...mcpgate.Option) *mcp.ClientSession {
	t.Helper()
	server := markedServer(p)
	gate, err := mcpgate.New(context.Background(), grpcDedupe(t), server,
		append([]mcpgate.Option{mcpgate.WithLogger(quiet()), mcpgate.WithTool("pay", policy)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	ct, st := mcp.NewInMemoryTransports()
	ss, err := server.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	return connect(t, ct)
}

var payArgs = map[string]any{"customer": "c1", "amount": 5}

func resultJSON(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	c := *res
	c.Meta = nil
	b, err := json.Marshal(&c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestFinalErrorIsStoredAndReplayed(t *testing.T) {
	p := &provider{fail: func(context.Context) error { return idemgate.FinalError(errors.New("card declined by the provider")) }}
	s := markedFixture(t, p, mcpgate.ToolPolicy{})
	first := call(t, s, "pay", "final-1", payArgs)
	if !first.IsError || replayed(first) || errInfo(first) != nil {
		t.Fatalf("first = %+v, want the tool's own error result, not replayed", first)
	}
	again := call(t, s, "pay", "final-1", payArgs)
	if !replayed(again) || resultJSON(t, again) != resultJSON(t, first) {
		t.Fatalf("duplicate = %s (replayed %v), want the stored error result %s", resultJSON(t, again), replayed(again), resultJSON(t, first))
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("the provider ran %d times, want 1: a final error is the outcome", n)
	}
}

func TestRetryableErrorReleasesEvenWhenErrorsReplay(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	p := &provider{fail: func(context.Context) error {
		if fail.Swap(false) {
			return idemgate.RetryableError(errors.New("provider refused before acting"))
		}
		return nil
	}}
	s := markedFixture(t, p, mcpgate.ToolPolicy{ReplayErrors: true})
	if first := call(t, s, "pay", "retry-1", payArgs); !first.IsError || replayed(first) {
		t.Fatalf("first = %+v, want the tool's error", first)
	}
	again := call(t, s, "pay", "retry-1", payArgs)
	if again.IsError || replayed(again) {
		t.Fatalf("retry = %+v, want a fresh run that succeeds", again)
	}
	if n := p.runs.Load(); n != 2 {
		t.Fatalf("the provider ran %d times, want 2: a retryable error releases the key", n)
	}
}

func TestOutcomeUnknownErrorFailsClosed(t *testing.T) {
	p := &provider{fail: func(context.Context) error {
		return idemgate.OutcomeUnknownError(errors.New("the provider's answer was lost"))
	}}
	s := markedFixture(t, p, mcpgate.ToolPolicy{})
	first := call(t, s, "pay", "unknown-1", payArgs)
	if e := wantReason(t, first, idemgate.ReasonOutcomeUnknown); !strings.Contains(fmt.Sprint(e["message"]), "OutcomeUnknownError") {
		t.Errorf("refusal %v does not name the mark", e)
	}
	wantReason(t, call(t, s, "pay", "unknown-1", payArgs), idemgate.ReasonOutcomeUnknown)
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("the provider ran %d times, want 1: an unknown outcome never runs again under FAIL_CLOSED", n)
	}
}

func TestOutcomeUnknownErrorRunsAgainUnderReexecute(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	p := &provider{fail: func(context.Context) error {
		if fail.Swap(false) {
			return idemgate.OutcomeUnknownError(errors.New("the provider's answer was lost"))
		}
		return nil
	}}
	s := markedFixture(t, p, mcpgate.ToolPolicy{OnLostOutcome: idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_REEXECUTE})
	if first := call(t, s, "pay", "unknown-2", payArgs); !first.IsError || errInfo(first) != nil {
		t.Fatalf("first = %+v, want the tool's own error under REEXECUTE", first)
	}
	if again := call(t, s, "pay", "unknown-2", payArgs); again.IsError || replayed(again) {
		t.Fatalf("retry = %+v, want a fresh run", again)
	}
	if n := p.runs.Load(); n != 2 {
		t.Fatalf("the provider ran %d times, want 2", n)
	}
}

func TestReconcilerSettlesALostOutcome(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	p := &provider{fail: func(context.Context) error {
		if fail.Swap(false) {
			return idemgate.OutcomeUnknownError(errors.New("the provider's answer was lost"))
		}
		return nil
	}}
	var asked atomic.Int64
	reconciled := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ch_found_at_provider"}}}
	s := markedFixture(t, p, mcpgate.ToolPolicy{Reconcile: func(ctx context.Context, key string, args json.RawMessage) (mcpgate.Resolution, error) {
		asked.Add(1)
		if key != "rec-1" || !strings.Contains(string(args), `"customer":"c1"`) {
			return mcpgate.StillUnknown(), fmt.Errorf("asked about key %q args %s", key, args)
		}
		return mcpgate.ResolvedResult(reconciled), nil
	}})
	wantReason(t, call(t, s, "pay", "rec-1", payArgs), idemgate.ReasonOutcomeUnknown)
	again := call(t, s, "pay", "rec-1", payArgs)
	if again.IsError || !replayed(again) {
		t.Fatalf("after reconciling = %+v, want the reconciled result replayed", again)
	}
	if got := again.Content[0].(*mcp.TextContent).Text; got != "ch_found_at_provider" {
		t.Fatalf("content %q, want the reconciler's", got)
	}
	if n, a := p.runs.Load(), asked.Load(); n != 1 || a != 1 {
		t.Fatalf("provider ran %d times and the reconciler was asked %d times, want 1 and 1", n, a)
	}
}

func TestFinishAfterReplyStoresRightAfterTheAnswer(t *testing.T) {
	p := &provider{}
	s := markedFixture(t, p, mcpgate.ToolPolicy{FinishAfterReply: true, MaxWait: 10 * time.Second})
	first := call(t, s, "pay", "after-1", payArgs)
	if first.IsError || replayed(first) {
		t.Fatalf("first = %+v, want a fresh run", first)
	}
	var again *mcp.CallToolResult
	for range 100 {
		again = call(t, s, "pay", "after-1", payArgs)
		if e := errInfo(again); e == nil || e["reason"] != idemgate.ReasonInFlight {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !replayed(again) || resultJSON(t, again) != resultJSON(t, first) {
		t.Fatalf("duplicate = %s, want the first answer %s replayed", resultJSON(t, again), resultJSON(t, first))
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("the provider ran %d times, want 1", n)
	}
}

// healthRecorder is a HealthSetter that keeps every status it was set to.
type healthRecorder struct {
	mu  sync.Mutex
	got []healthpb.HealthCheckResponse_ServingStatus
}

func (h *healthRecorder) SetServingStatus(service string, s healthpb.HealthCheckResponse_ServingStatus) {
	if service != idemgate.DedupeHealthService {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got = append(h.got, s)
}

func (h *healthRecorder) last() healthpb.HealthCheckResponse_ServingStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.got) == 0 {
		return healthpb.HealthCheckResponse_SERVICE_UNKNOWN
	}
	return h.got[len(h.got)-1]
}

// An MCP server whose Dedupe service cannot be reached says so: in its log
// on the first gated call, from CheckDedupe, and in its health.
func TestDedupeServiceDownIsLoggedAndUnhealthy(t *testing.T) {
	conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	var logs testlog.Buffer
	p := &provider{}
	server := markedServer(p)
	gate, err := mcpgate.New(context.Background(), idemgatev1.NewDedupeServiceClient(conn), server,
		mcpgate.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), mcpgate.WithDedupeConn(conn), mcpgate.WithDedupeTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ct, st := mcp.NewInMemoryTransports()
	ss, err := server.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	s := connect(t, ct)

	wantReason(t, call(t, s, "pay", "down-1", payArgs), idemgate.ReasonStoreUnavailable)
	if p.runs.Load() != 0 {
		t.Fatal("the tool ran without a reservation")
	}
	if !strings.Contains(logs.String(), "a Dedupe service RPC failed") || !strings.Contains(logs.String(), "127.0.0.1:1") {
		t.Errorf("log does not say the Dedupe service failed, naming it:\n%s", logs.String())
	}
	if err := gate.CheckDedupe(context.Background()); grpcerr.Reason(err) != idemgate.ReasonStoreUnavailable {
		t.Errorf("CheckDedupe = %v, want %s", err, idemgate.ReasonStoreUnavailable)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hs := &healthRecorder{}
	done := make(chan struct{})
	go func() { gate.WatchDedupe(ctx, hs); close(done) }()
	deadline := time.Now().Add(30 * time.Second)
	for hs.last() != healthpb.HealthCheckResponse_NOT_SERVING && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := hs.last(); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health = %v, want NOT_SERVING", got)
	}
	cancel()
	<-done
}

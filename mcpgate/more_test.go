package mcpgate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/mcpgate"
)

// The concurrency promise holds on both stores, in process and over gRPC.
func TestConcurrentDuplicatesRunOnceOnPostgreSQL(t *testing.T) {
	f := setup(t, grpcDedupe(t))
	const n = 6
	results := make([]*mcp.CallToolResult, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = call(t, f.client, "charge", "order-pg", order) }()
	}
	wg.Wait()
	if c := f.tools.charges.Load(); c != 1 {
		t.Fatalf("charges = %d, want 1", c)
	}
	ids := map[any]bool{}
	for _, res := range results {
		if res.IsError {
			wantReason(t, res, idemgate.ReasonInFlight)
			continue
		}
		ids[structured(t, res)["charge_id"]] = true
	}
	if len(ids) != 1 {
		t.Fatalf("charge ids %v, want one", ids)
	}
}

// failingDedupe is a Dedupe service that cannot be reached.
type failingDedupe struct{ idemgatev1.DedupeServiceClient }

func (failingDedupe) Begin(context.Context, *idemgatev1.BeginRequest, ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	return nil, status.Error(codes.InvalidArgument, "refused") // a definite refusal: nothing to follow up
}

func TestAnUnreachableStoreFailsClosed(t *testing.T) {
	f := setup(t, failingDedupe{})
	e := wantReason(t, call(t, f.client, "charge", "k", order), idemgate.ReasonStoreRejected)
	if e["code"] != "INTERNAL" || f.tools.charges.Load() != 0 {
		t.Fatalf("refusal %v after %d charges, want INTERNAL and no charge", e, f.tools.charges.Load())
	}
}

type unavailableDedupe struct{ idemgatev1.DedupeServiceClient }

func (unavailableDedupe) Begin(context.Context, *idemgatev1.BeginRequest, ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	return nil, status.Error(codes.Unavailable, "down")
}

func TestADownStoreAnswersStoreUnavailable(t *testing.T) {
	f := setup(t, unavailableDedupe{}, mcpgate.WithFinishRetryBudget(1))
	e := wantReason(t, call(t, f.client, "charge", "k", order), idemgate.ReasonStoreUnavailable)
	if e["advice"] != "retry_same_key" || e["retryAfterSeconds"] == nil || f.tools.charges.Load() != 0 {
		t.Fatalf("refusal %v after %d charges, want retry_same_key with a delay and no charge", e, f.tools.charges.Load())
	}
}

// WithStoreRetryAfter sets the delay a caller is told to wait before it
// retries a call the down store refused, as on every other gate.
func TestStoreRetryAfterSetsTheDelay(t *testing.T) {
	f := setup(t, unavailableDedupe{}, mcpgate.WithFinishRetryBudget(1), mcpgate.WithStoreRetryAfter(7*time.Second))
	e := wantReason(t, call(t, f.client, "charge", "k", order), idemgate.ReasonStoreUnavailable)
	if e["retryAfterSeconds"] != 7.0 {
		t.Fatalf("refusal %v, want retryAfterSeconds 7", e)
	}
}

// Under REEXECUTE a tool whose outcome is unknown frees its key: the retry
// runs.
func TestAnUnknownOutcomeUnderReexecuteRunsAgain(t *testing.T) {
	dedupe := embeddedDedupe(t)
	server := mcp.NewServer(&mcp.Implementation{Name: "s"}, nil)
	var runs int
	mcp.AddTool(server, &mcp.Tool{Name: "send"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		runs++
		if runs == 1 {
			return nil, nil, context.DeadlineExceeded
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent"}}}, nil, nil
	})
	if _, err := mcpgate.New(context.Background(), dedupe, server, mcpgate.WithLogger(quiet()),
		mcpgate.WithTool("send", mcpgate.ToolPolicy{OnLostOutcome: idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_REEXECUTE})); err != nil {
		t.Fatal(err)
	}
	ct, st := mcp.NewInMemoryTransports()
	if _, err := server.Connect(context.Background(), st, nil); err != nil {
		t.Fatal(err)
	}
	cs := connect(t, ct)
	if res := call(t, cs, "send", "k", nil); !res.IsError {
		t.Fatalf("first = %+v, want the tool's error", res)
	}
	if res := call(t, cs, "send", "k", nil); res.IsError || replayed(res) || runs != 2 {
		t.Fatalf("retry = %+v after %d runs, want a second run", res, runs)
	}
}

// A tool added after New is classified on its first call: gated by MCP's
// defaults, refused under strict mode.
func TestToolsAddedLater(t *testing.T) {
	for _, strict := range []bool{false, true} {
		ts := &tools{}
		server := ts.newServer()
		opts := []mcpgate.Option{mcpgate.WithLogger(quiet()), mcpgate.WithTool("charge", mcpgate.ToolPolicy{})}
		if strict {
			opts = append(opts, mcpgate.WithStrict())
		}
		if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, opts...); err != nil {
			t.Fatal(err)
		}
		var runs int
		mcp.AddTool(server, &mcp.Tool{Name: "late"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			runs++
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
		})
		ct, st := mcp.NewInMemoryTransports()
		if _, err := server.Connect(context.Background(), st, nil); err != nil {
			t.Fatal(err)
		}
		cs := connect(t, ct)
		if strict {
			e := wantReason(t, call(t, cs, "late", "k", nil), idemgate.ReasonStoreRejected)
			if !strings.Contains(e["message"].(string), `"late"`) || runs != 0 {
				t.Fatalf("strict: %v after %d runs, want a refusal naming late and no run", e, runs)
			}
			continue
		}
		wantReason(t, call(t, cs, "late", "", nil), idemgate.ReasonKeyMissing)
		call(t, cs, "late", "k", nil)
		if res := call(t, cs, "late", "k", nil); !replayed(res) || runs != 1 {
			t.Fatalf("late tool: %+v after %d runs, want gated", res, runs)
		}
	}
}

// A tool that a middleware inside the gate hides from tools/list is still
// gated: the gate keeps what it resolved under the name.
func TestAToolHiddenFromTheListStaysGated(t *testing.T) {
	ts := &tools{}
	server := ts.newServer()
	hide := false
	var mu sync.Mutex
	server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			mu.Lock()
			defer mu.Unlock()
			if list, ok := res.(*mcp.ListToolsResult); ok && hide {
				kept := []*mcp.Tool{}
				for _, tool := range list.Tools {
					if tool.Name != "charge" {
						kept = append(kept, tool)
					}
				}
				return &mcp.ListToolsResult{Tools: kept}, err
			}
			return res, err
		}
	})
	if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet())); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	hide = true
	mu.Unlock()
	ct, st := mcp.NewInMemoryTransports()
	if _, err := server.Connect(context.Background(), st, nil); err != nil {
		t.Fatal(err)
	}
	cs := connect(t, ct)
	wantReason(t, call(t, cs, "charge", "", order), idemgate.ReasonKeyMissing)
	if ts.charges.Load() != 0 {
		t.Fatal("the hidden tool ran ungated")
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := setup(t, embeddedDedupe(t), mcpgate.WithRegisterer(reg))
	call(t, f.client, "charge", "m-1", order)
	call(t, f.client, "charge", "m-1", order)
	call(t, f.client, "charge", "", order)
	call(t, f.client, "flaky", "m-2", nil)
	call(t, f.client, "balance", "", nil)
	for _, tc := range []struct {
		tool, outcome string
		want          float64
	}{
		{"charge", "executed", 1}, {"charge", "replayed", 1}, {"charge", "key_missing", 1}, {"flaky", "released", 1}, {"balance", "executed", 0},
	} {
		got, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var v float64
		for _, mf := range got {
			if mf.GetName() != "idemgate_mcpgate_calls_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["tool"] == tc.tool && labels["outcome"] == tc.outcome {
					v = m.GetCounter().GetValue()
				}
			}
		}
		if v != tc.want {
			t.Errorf("calls_total{tool=%s,outcome=%s} = %v, want %v", tc.tool, tc.outcome, v, tc.want)
		}
	}
}

// TestStagesTimeEachPartOfACall: as the gRPC gate's
// idemgate_interceptor_stage_seconds, idemgate_mcpgate_stage_seconds times
// a run in all four stages and a replay only before and during its Begin
// (no handler, nothing to store), per tool, with the gates' shared buckets.
func TestStagesTimeEachPartOfACall(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	f := setup(t, embeddedDedupe(t), mcpgate.WithRegisterer(reg))
	call(t, f.client, "charge", "st-1", order) // executed
	call(t, f.client, "charge", "st-1", order) // replayed
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range families {
		if mf.GetName() != "idemgate_mcpgate_stage_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			h := m.GetHistogram()
			counts[labels["tool"]+"/"+labels["stage"]] = h.GetSampleCount()
			var bounds []float64
			for _, b := range h.GetBucket() {
				bounds = append(bounds, b.GetUpperBound())
			}
			if fmt.Sprint(bounds) != fmt.Sprint(idemgate.StageBuckets) {
				t.Errorf("%v buckets %v, want idemgate.StageBuckets %v", labels, bounds, idemgate.StageBuckets)
			}
		}
	}
	want := map[string]uint64{"charge/prepare": 2, "charge/begin": 2, "charge/handler": 1, "charge/finish": 1}
	if fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Errorf("stages observed %v, want %v", counts, want)
	}
}

// The tenant function's refusal reaches the caller, and nothing runs.
func TestATenantRefusal(t *testing.T) {
	f := setup(t, embeddedDedupe(t), mcpgate.WithTenant(func(context.Context, *mcp.CallToolRequest) (string, error) {
		return "", status.Error(codes.PermissionDenied, "no tenant for this session")
	}))
	res := call(t, f.client, "charge", "k", order)
	if e := errInfo(res); !res.IsError || e["code"] != "PERMISSION_DENIED" || f.tools.charges.Load() != 0 {
		t.Fatalf("result %+v after %d charges, want PERMISSION_DENIED and no charge", res, f.tools.charges.Load())
	}
}

// countingDedupe counts the Begins that reach the Dedupe service.
type countingDedupe struct {
	idemgatev1.DedupeServiceClient
	begins atomic.Int64
}

func (c *countingDedupe) Begin(ctx context.Context, req *idemgatev1.BeginRequest, opts ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	c.begins.Add(1)
	return c.DedupeServiceClient.Begin(ctx, req, opts...)
}

// With the replay cache a duplicate is answered without a Begin, with the
// same result; another request with the key still asks the service.
func TestReplayCache(t *testing.T) {
	d := &countingDedupe{DedupeServiceClient: embeddedDedupe(t)}
	f := setup(t, d, mcpgate.WithReplayCache(100, 1<<20))
	first := call(t, f.client, "charge", "c-1", order)
	second := call(t, f.client, "charge", "c-1", order)
	if n := d.begins.Load(); n != 1 || !replayed(second) || structured(t, first)["charge_id"] != structured(t, second)["charge_id"] {
		t.Fatalf("%d Begins, second %+v: want one Begin and the replay", n, second)
	}
	wantReason(t, call(t, f.client, "charge", "c-1", map[string]any{"customer": "x", "amount": 1}), idemgate.ReasonKeyReused)
	if s := f.gate.Stats(); d.begins.Load() != 2 || s.ReplayCacheHits != 1 || s.ReplayCacheMisses != 2 {
		t.Fatalf("%d Begins, stats %+v: want the other request asked the service", d.begins.Load(), s)
	}
}

// When the gate cannot list the tools (a middleware inside it fails
// tools/list), a gated tool does not run ungated: the caller gets a refusal.
func TestAFailedToolsListRefusesTheCall(t *testing.T) {
	ts := &tools{}
	server := ts.newServer()
	var fail atomic.Bool
	server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "tools/list" && fail.Load() {
				return nil, errors.New("tools/list is broken")
			}
			return next(ctx, method, req)
		}
	})
	if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet())); err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	ct, st := mcp.NewInMemoryTransports()
	if _, err := server.Connect(context.Background(), st, nil); err != nil {
		t.Fatal(err)
	}
	cs := connect(t, ct)
	e := wantReason(t, call(t, cs, "charge", "k-list", order), idemgate.ReasonStoreRejected)
	if e["code"] != "INTERNAL" || ts.charges.Load() != 0 {
		t.Fatalf("refusal %v after %d charges, want INTERNAL and no charge", e, ts.charges.Load())
	}
}

// A tool whose own backend call ended with a gRPC DEADLINE_EXCEEDED or
// CANCELLED cannot tell whether its side effect happened: as in the
// interceptor, the outcome is unknown, and under FAIL_CLOSED a retry does
// not run the tool again.
func TestAGRPCDeadlineOrCancelFromTheToolIsAnUnknownOutcome(t *testing.T) {
	for _, code := range []codes.Code{codes.DeadlineExceeded, codes.Canceled} {
		t.Run(code.String(), func(t *testing.T) {
			server := mcp.NewServer(&mcp.Implementation{Name: "s"}, nil)
			var runs atomic.Int64
			mcp.AddTool(server, &mcp.Tool{Name: "send"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
				runs.Add(1)
				return nil, nil, status.Error(code, "the provider call ended")
			})
			if _, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet())); err != nil {
				t.Fatal(err)
			}
			ct, st := mcp.NewInMemoryTransports()
			if _, err := server.Connect(context.Background(), st, nil); err != nil {
				t.Fatal(err)
			}
			cs := connect(t, ct)
			wantReason(t, call(t, cs, "send", "k", nil), idemgate.ReasonOutcomeUnknown)
			wantReason(t, call(t, cs, "send", "k", nil), idemgate.ReasonOutcomeUnknown)
			if n := runs.Load(); n != 1 {
				t.Fatalf("the tool ran %d times, want 1", n)
			}
		})
	}
}

// WithTenant(nil) is refused by New, naming the option, rather than
// panicking on the first gated call.
func TestWithTenantNilIsRefused(t *testing.T) {
	_, err := mcpgate.New(context.Background(), embeddedDedupe(t), (&tools{}).newServer(), mcpgate.WithLogger(quiet()), mcpgate.WithTenant(nil))
	if err == nil || !strings.Contains(err.Error(), "WithTenant") {
		t.Fatalf("New with WithTenant(nil) = %v, want an error naming WithTenant", err)
	}
}

// The test server's charge ids stay decimal past nine charges.
func TestChargeIDsPastNine(t *testing.T) {
	f := setup(t, embeddedDedupe(t))
	var last *mcp.CallToolResult
	for i := 1; i <= 12; i++ {
		last = call(t, f.client, "charge", fmt.Sprintf("ids-%d", i), order)
	}
	if id := structured(t, last)["charge_id"]; id != "ch_000012" {
		t.Fatalf("the 12th charge id = %v, want ch_000012", id)
	}
}

package console_test

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/console"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/outcomejson"
	"github.com/idemgate/idemgate/internal/protoset"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// toolScope is the scope the gate stores the tool's calls under: the
// method's full name (the stack has no tenant).
const toolScope = testingv1.TestService_Mutate_FullMethodName

// The tool fixture's quotas per caller.
const (
	toolMaxRecords = 10
	toolMaxBytes   = 1 << 20
)

// tool is a gated tool server's handler that counts its runs per key. The
// first run of a key named in timeouts fails as a payment provider that
// took the request and never answered: the side effect may have happened
// (idemgate.OutcomeUnknownError), so the gate blocks its key.
type tool struct {
	testingv1.UnimplementedTestServiceServer

	mu       sync.Mutex
	runs     map[string]int
	timeouts map[string]bool
	total    atomic.Int64
}

// Mutate implements testingv1.TestServiceServer.
func (s *tool) Mutate(ctx context.Context, req *testingv1.MutateRequest) (*testingv1.MutateResponse, error) {
	// Honour the context: a call given up on runs nothing.
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	key, _ := idemgate.KeyFromContext(ctx)
	s.mu.Lock()
	s.runs[key]++
	timeout := s.timeouts[key]
	delete(s.timeouts, key)
	s.mu.Unlock()
	n := s.total.Add(1)
	if timeout {
		return nil, idemgate.OutcomeUnknownError(status.Error(codes.DeadlineExceeded, "the payment provider did not answer"))
	}
	return &testingv1.MutateResponse{Payload: req.GetPayload(), Execution: n, Key: key}, nil
}

// runsOf is how many times the handler ran for key.
func (s *tool) runsOf(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[key]
}

// toolFixture is a console over the Dedupe service of a gated tool server
// (stacktest: the interceptor's gate on a gRPC server, over loopback TCP to
// the Dedupe service on a fresh schema).
type toolFixture struct {
	*fixture
	tool   *tool
	client testingv1.TestServiceClient
}

// toolDescriptors are the tool's types as the service reads them from
// -console-descriptors: testing.proto and its imports, from the descriptors
// linked into the test (protodesc.ToFileDescriptorProto), written as a
// FileDescriptorSet file and read back.
func toolDescriptors(t *testing.T) *protoregistry.Files {
	t.Helper()
	set, err := protoset.Build(protoregistry.GlobalFiles, testingv1.File_idemgate_testing_v1_testing_proto.Path())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := proto.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tools.binpb")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	files, err := outcomejson.ReadFile("-console-descriptors", path)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// newToolFixture's console has the tool's descriptors; its Dedupe service keeps its callers to quotas of
// toolMaxRecords records and toolMaxBytes outcome bytes, and counts its
// refusals and times its calls in a registry the console reads, sampled
// every second so the Activity page's screenshot has a few points.
func newToolFixture(t *testing.T) *toolFixture {
	t.Helper()
	h := &tool{runs: map[string]int{}, timeouts: map[string]bool{}}
	metrics := dedupesvc.NewMetrics()
	registry := prometheus.NewRegistry()
	registry.MustRegister(metrics)
	stack := stacktest.Start(t, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, h) }, stacktest.Config{DedupeMetrics: metrics,
		DedupeOptions: []dedupesvc.Option{dedupesvc.WithCallerQuota(toolMaxRecords, toolMaxBytes)}})
	descriptors := toolDescriptors(t)
	f := consoleOver(t, stack.Store, stack.Service, stack.Pool, &logBuffer{}, func(c *console.Config) {
		c.MaxRecords, c.MaxBytes, c.Metrics, c.ActivityInterval = toolMaxRecords, toolMaxBytes, registry, time.Second
		c.Descriptors = descriptors
	})
	return &toolFixture{fixture: f, tool: h, client: testingv1.NewTestServiceClient(stack.Tool)}
}

// call calls the gated tool with key, as an agent would; timeout makes the
// handler's first run for key end with its outcome unknown.
func (f *toolFixture) call(t *testing.T, key string, timeout bool) (*testingv1.MutateResponse, error) {
	t.Helper()
	if timeout {
		f.tool.mu.Lock()
		f.tool.timeouts[key] = true
		f.tool.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, key)
	return f.client.Mutate(ctx, &testingv1.MutateRequest{Payload: "charge " + key})
}

// toolState is the state of the tool's record of key.
func (f *toolFixture) toolState(t *testing.T, key string) string {
	t.Helper()
	resp, err := f.admin.GetRecord(context.Background(), &idemgatev1.GetRecordRequest{Ref: &idemgatev1.RecordRef{Scope: toolScope, Key: key}})
	if err != nil {
		t.Fatalf("GetRecord %s: %v", key, err)
	}
	return resp.GetRecord().GetState()
}

// An outcome-unknown key of a gated tool server completed through the
// console with the JSON of the method's response: the agent's next call
// gets that outcome, replayed, and the handler does not run again.
func TestCompletedKeyReplaysThroughTheToolServer(t *testing.T) {
	t.Parallel()
	f := newToolFixture(t)
	if _, err := f.call(t, "order-1", true); grpcerr.Reason(err) != idemgate.ReasonOutcomeUnknown {
		t.Fatalf("call order-1 whose provider times out: %v, want %s", err, idemgate.ReasonOutcomeUnknown)
	}
	b := f.browser(t)
	csrf := b.signedIn()
	form := url.Values{"ns": {""}, "scope": {toolScope}, "key": {"order-1"}, "csrf": {csrf}, "resolution": {"complete"},
		"outcome_json": {`{"payload": "charged by hand", "execution": "41", "key": "order-1"}`}}
	resp, page := b.post("/resolve", form)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "idemgate.testing.v1.MutateResponse") {
		t.Fatalf("review: %s\n%s", resp.Status, page)
	}
	form.Set("outcome_json", html.UnescapeString(field(t, hiddenField("outcome_json"), page)))
	form.Set("type_url", field(t, hiddenField("type_url"), page))
	form.Set("confirm", "yes")
	if resp, page := b.post("/resolve", form); resp.StatusCode != http.StatusOK || !strings.Contains(page, "Completed") {
		t.Fatalf("complete: %s\n%s", resp.Status, page)
	}
	got, err := f.call(t, "order-1", false)
	want := &testingv1.MutateResponse{Payload: "charged by hand", Execution: 41, Key: "order-1"}
	if err != nil || !proto.Equal(got, want) {
		t.Fatalf("call order-1 after its completion: %v, %v; want the replay of %v", got, err, want)
	}
	if runs := f.tool.runsOf("order-1"); runs != 1 {
		t.Fatalf("order-1 ran %d times, want 1 (the run whose outcome was lost; the completion is replayed)", runs)
	}
}

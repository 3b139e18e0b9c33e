package gatecore

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// While one failure goes on, a line is logged once per interval, counting
// the failures it did not log; another code is logged at once; the first
// answer after a logged failure says the service answers again.
func TestDedupeFailureLogIsRateLimited(t *testing.T) {
	var buf bytes.Buffer
	d := NewObserver(nil, nil, slog.New(slog.NewJSONHandler(&buf, nil)), 0)
	buf.Reset() // the start-up warning (no connection) is not counted here
	clock := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	d.now = func() time.Time { return clock }
	down := status.Error(codes.Unavailable, "connection refused")

	d.observe("Begin", down, true)
	d.observe("Begin", down, true)
	d.observe("Finish", down, true)
	clock = clock.Add(DefaultDedupeFailureLogInterval)
	d.observe("Begin", down, true)
	d.observe("Begin", status.Error(codes.Unauthenticated, "unknown token"), true)
	d.observe("Begin", status.Error(codes.FailedPrecondition, "not held"), true) // an answer: the service is back

	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, rec)
	}
	want := []struct {
		msg, code  string
		suppressed float64
	}{
		{"RPC failed", "Unavailable", 0},
		{"RPC failed", "Unavailable", 2},
		{"RPC failed", "Unauthenticated", 0},
		{"answers again", "", 0},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		l := lines[i]
		if !strings.Contains(l["msg"].(string), w.msg) || (w.code != "" && l["code"] != w.code) || l["suppressed"] != w.suppressed {
			t.Errorf("line %d = %v, want %q code %q suppressed %v", i, l, w.msg, w.code, w.suppressed)
		}
	}
	if lines[3]["failures"] != 5.0 {
		t.Errorf("recovery line %v, want failures=5", lines[3])
	}
}

// A quota refusal (RESOURCE_EXHAUSTED) is the service answering one caller,
// often one agent among many behind this tool server: it is logged, but the
// tool server's health stays SERVING, so a load balancer does not take the
// tool server out for every agent because one ran over its limit. An
// unreachable service still turns health off, and an answer back on.
func TestQuotaRefusalKeepsHealth(t *testing.T) {
	var buf bytes.Buffer
	d := NewObserver(nil, nil, slog.New(slog.NewJSONHandler(&buf, nil)), 0)
	buf.Reset() // the start-up warning (no connection) is not counted here
	d.observe("Begin", status.Error(codes.ResourceExhausted, "over the rate"), true)
	if !d.healthy() {
		t.Fatal("one RESOURCE_EXHAUSTED refusal made the Dedupe service unhealthy")
	}
	if !strings.Contains(buf.String(), "ResourceExhausted") {
		t.Errorf("the quota refusal is not logged:\n%s", buf.String())
	}
	d.observe("Begin", status.Error(codes.Unavailable, "connection refused"), true)
	if d.healthy() {
		t.Fatal("an UNAVAILABLE answer left the Dedupe service healthy")
	}
	d.observe("Begin", status.Error(codes.ResourceExhausted, "over the rate"), true)
	if !d.healthy() {
		t.Fatal("a quota refusal, an answer, did not make an unreachable service healthy again")
	}
}

// A gate whose Dedupe client comes without its connection keeps grpc-go's
// reconnect backoff, up to two minutes: after a Dedupe service restart a
// live holder cannot renew within the lease it is granted, and its key is
// handed away (issue 31). New says so, loudly, once; with the connection
// it says nothing.
func TestAnObserverWithoutItsConnectionWarns(t *testing.T) {
	var buf bytes.Buffer
	NewObserver(nil, nil, slog.New(slog.NewJSONHandler(&buf, nil)), 0)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("want one JSON log line, got %q: %v", buf.String(), err)
	}
	if rec["level"] != slog.LevelWarn.String() || !strings.Contains(rec["msg"].(string), "WithDedupeConn") {
		t.Errorf("logged %v, want a warning naming WithDedupeConn", rec)
	}

	conn, err := grpc.NewClient("passthrough:///dedupe.invalid:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf.Reset()
	NewObserver(nil, conn, slog.New(slog.NewJSONHandler(&buf, nil)), 0)
	if buf.Len() != 0 {
		t.Errorf("with its connection it logged %q, want nothing", buf.String())
	}

	// A client that calls the service in this process has no connection
	// to reconnect: nothing to warn of.
	buf.Reset()
	NewObserver(inProcessClient{}, nil, slog.New(slog.NewJSONHandler(&buf, nil)), 0)
	if buf.Len() != 0 {
		t.Errorf("with an in-process client it logged %q, want nothing", buf.String())
	}
}

// inProcessClient is a Dedupe client that says it calls the service in
// this process, as dedupesvc.NewInProcessClient's does.
type inProcessClient struct{ idemgatev1.DedupeServiceClient }

func (inProcessClient) InProcess() bool { return true }

package gatecore

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// While one failure goes on, a line is logged once per interval, counting
// the failures it did not log; another code is logged at once; the first
// answer after a logged failure says the service answers again.
func TestDedupeFailureLogIsRateLimited(t *testing.T) {
	var buf bytes.Buffer
	d := NewObserver(nil, nil, slog.New(slog.NewJSONHandler(&buf, nil)), 0)
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

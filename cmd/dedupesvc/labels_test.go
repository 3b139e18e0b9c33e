//go:build faults

package main_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// The real binary's replay counter keeps a label for each caller's
// methods: one caller replaying more methods than the counter labels
// (issue 40 item 6: one caller took all 500, and every later method of
// every caller was counted as "other") takes at most its share, and a
// neighbour's method keeps its own label.
func TestBinaryReplayLabelsAreSharedAcrossCallers(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	const hogSecret, neighbourSecret = "hog-secret-0123456789abcdef", "neighbour-secret-0123456789ab"
	if err := os.WriteFile(tokens, []byte("hog client "+hogSecret+"\nneighbour client "+neighbourSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, metricsAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	proctest.Start(t, proctest.Build(t, dedupesvcPkg),
		[]string{"-listen", addr, "-data-dir", filepath.Join(dir, "data"), "-metrics-listen", metricsAddr, "-token-file", tokens},
		[]string{"DATABASE_URL="})
	// Generous: the binary starts inside this deadline on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	replay := func(secret, scope string) {
		t.Helper()
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(auth.BearerToken(secret, true)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		client := idemgatev1.NewDedupeServiceClient(conn)
		begin := &idemgatev1.BeginRequest{Scope: scope, Key: "k", Fingerprint: make([]byte, 32), AttemptToken: "a",
			Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)}
		res, err := client.Begin(ctx, begin, grpc.WaitForReady(true))
		if err != nil || res.GetReserved() == nil {
			t.Fatalf("Begin %s = %v, %v; want reserved", scope, res, err)
		}
		outcome, _ := anypb.New(durationpb.New(time.Second))
		if _, err := client.Finish(ctx, &idemgatev1.FinishRequest{Scope: scope, Key: "k", AttemptToken: "a", Epoch: res.GetReserved().GetEpoch(), Outcome: outcome}); err != nil {
			t.Fatalf("Finish %s: %v", scope, err)
		}
		begin.AttemptToken = "b"
		if res, err := client.Begin(ctx, begin); err != nil || res.GetCompleted() == nil {
			t.Fatalf("replay Begin %s = %v, %v; want completed", scope, res, err)
		}
	}
	hogMethods := dedupesvc.MaxReplayMethods + 10
	for i := range hogMethods {
		replay(hogSecret, fmt.Sprintf("/hog.v1.Hog/M%04d", i))
	}
	const neighbours = "/payments.v1.Payments/ChargeCard"
	replay(neighbourSecret, neighbours)

	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	hogLabels := 0
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, `idemgate_dedupe_replays_total{method="/hog.v1.Hog/`) {
			hogLabels++
		}
	}
	t.Logf("the hog replayed %d methods and holds %d labels", hogMethods, hogLabels)
	if want := `idemgate_dedupe_replays_total{method="` + neighbours + `"} 1`; !strings.Contains(string(body), want) {
		t.Errorf("after another caller replayed %d methods, /metrics lacks %q: the neighbour's replay went to %q", hogMethods, want, dedupesvc.OtherMethod)
	}
	if hogLabels > dedupesvc.MaxReplayMethodsPerCaller {
		t.Errorf("one caller holds %d method labels, want at most %d (MaxReplayMethodsPerCaller)", hogLabels, dedupesvc.MaxReplayMethodsPerCaller)
	}
	if want := `idemgate_dedupe_replays_total{method="` + dedupesvc.OtherMethod + `"} ` + fmt.Sprint(hogMethods-dedupesvc.MaxReplayMethodsPerCaller); !strings.Contains(string(body), want) {
		t.Errorf("/metrics lacks %q: the hog's replays past its share", want)
	}
}

package main_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/idemgate/idemgate/connectgate"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/gen/examples/payments/v1/paymentsv1connect"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/connectbomb"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// payments-server -connect-listen serves the payments service over Connect,
// gRPC and gRPC-Web too, gated by connectgate on the same Dedupe service: a
// key charges once whichever listener and protocol carries it, curl with the
// Connect protocol's JSON included.
func TestPaymentsServerOverConnect(t *testing.T) {
	dedupeAddr := stacktest.ServeApp(t, dedupeapp.Config{DatabaseURL: pgtest.SchemaURL(t)})
	grpcAddr, connectAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	tool := proctest.Start(t, proctest.Build(t, "github.com/idemgate/idemgate/cmd/payments-server"),
		[]string{"-listen", grpcAddr, "-dedupe", dedupeAddr, "-connect-listen", connectAddr, "-metrics-listen="}, nil)
	tool.WaitTCP(t, grpcAddr, 2*time.Minute)
	tool.WaitTCP(t, connectAddr, 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// curl, as docs/gating.md shows it.
	curl := func(key string) (body, header string) {
		t.Helper()
		out, err := exec.CommandContext(ctx, "curl", "-sS", "-i", "-H", "Content-Type: application/json", "-H", "Idempotency-Key: "+key,
			"-d", `{"customerId":"cust_1","amountCents":500}`,
			"http://"+connectAddr+paymentsv1connect.PaymentsServiceChargeCardProcedure).CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v: %s\npayments-server log:\n%s", err, out, tool.Log())
		}
		head, body, _ := strings.Cut(strings.ReplaceAll(string(out), "\r\n", "\n"), "\n\n")
		return body, strings.ToLower(head)
	}
	first, firstHeader := curl("curl-1")
	again, againHeader := curl("curl-1")
	if !strings.Contains(firstHeader, "200 ok") || !strings.Contains(first, `"chargeId":"ch_`) || strings.Contains(firstHeader, "idempotency-replayed") {
		t.Fatalf("first curl: %s\n%s", firstHeader, first)
	}
	if again != first || !strings.Contains(againHeader, "idempotency-replayed: true") {
		t.Fatalf("second curl %s (headers %s), want the first body %s replayed", again, againHeader, first)
	}
	missing, missingHeader := curl("")
	if !strings.Contains(missingHeader, "400 bad request") || !strings.Contains(missing, `"code":"invalid_argument"`) || !strings.Contains(missing, "IDEMPOTENCY_KEY_MISSING") {
		t.Fatalf("curl without a key: %s\n%s", missingHeader, missing)
	}

	// Connect's client over each protocol, then gRPC on the gRPC listener:
	// one charge for one key.
	var charge string
	for _, opts := range [][]connect.ClientOption{nil, {connect.WithGRPC()}, {connect.WithGRPCWeb()}} {
		client := paymentsv1connect.NewPaymentsServiceClient(h2cClient(t), "http://"+connectAddr, opts...)
		req := connect.NewRequest(&paymentsv1.ChargeCardRequest{CustomerId: "cust_2", AmountCents: 700})
		req.Header().Set("Idempotency-Key", "order-2")
		resp, err := client.ChargeCard(ctx, req)
		if err != nil {
			t.Fatalf("ChargeCard over Connect: %v", err)
		}
		if charge == "" {
			charge = resp.Msg.GetChargeId()
		} else if resp.Msg.GetChargeId() != charge || resp.Header().Get("Idempotency-Replayed") != "true" {
			t.Fatalf("duplicate charge %s (headers %v), want %s replayed", resp.Msg.GetChargeId(), resp.Header(), charge)
		}
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := paymentsv1.NewPaymentsServiceClient(conn).ChargeCard(metadata.AppendToOutgoingContext(ctx, "idempotency-key", "order-2"),
		&paymentsv1.ChargeCardRequest{CustomerId: "cust_2", AmountCents: 700})
	if err != nil || resp.GetChargeId() != charge {
		t.Fatalf("ChargeCard over gRPC with the same key: %v, %v; want charge %s", resp, err, charge)
	}
	balance, err := paymentsv1.NewPaymentsServiceClient(conn).GetBalance(ctx, &paymentsv1.GetBalanceRequest{CustomerId: "cust_2"})
	if err != nil || balance.GetCharges() != 1 {
		t.Fatalf("GetBalance: %v, %v; want 1 charge for one key", balance, err)
	}
	// Both gates follow the one Dedupe connection (WithDedupeConn), so
	// neither waits out a reconnect backoff after a Dedupe restart.
	if strings.Contains(tool.Log(), "without WithDedupeConn") {
		t.Fatalf("a gate of payments-server was built without WithDedupeConn:\n%s", tool.Log())
	}
}

// h2cClient speaks HTTP/2 without TLS, as gRPC needs.
func h2cClient(t *testing.T) *http.Client {
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	c := &http.Client{Transport: &http.Transport{Protocols: protocols}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// payments-server's Connect listener refuses a request that inflates past 4
// MiB (gRPC's limit) before it decodes it: four gzip bodies of about 270 KB
// sent at once, each a 256 MiB customer_id, over the Connect, gRPC and
// gRPC-Web protocols, get RESOURCE_EXHAUSTED and
// IDEMPOTENCY_REQUEST_TOO_LARGE; no charge ran under their keys (a small
// charge with each key runs, not a replay nor IDEMPOTENCY_KEY_REUSED); and
// the process's peak resident memory stays under 200 MB. Before the limits
// the four inflated to 256 MiB fields each and charged (3,272 MB peak).
func TestPaymentsServerConnectRefusesGzipBombs(t *testing.T) {
	dedupeAddr := stacktest.ServeApp(t, dedupeapp.Config{DatabaseURL: pgtest.SchemaURL(t)})
	grpcAddr, connectAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	tool := proctest.Start(t, proctest.Build(t, "github.com/idemgate/idemgate/cmd/payments-server"),
		[]string{"-listen", grpcAddr, "-dedupe", dedupeAddr, "-connect-listen", connectAddr, "-metrics-listen="}, nil)
	tool.WaitTCP(t, connectAddr, 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	bomb := connectbomb.Gzip(256<<20, connectbomb.ChargeAmount)
	protocols := [][]connect.ClientOption{nil, {connect.WithGRPC()}, {connect.WithGRPCWeb()}, nil}
	errs := make([]error, len(protocols))
	var wg sync.WaitGroup
	for i, opts := range protocols {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := paymentsv1connect.NewPaymentsServiceClient(h2cClient(t), "http://"+connectAddr, append(connectbomb.ClientOptions(bomb), opts...)...)
			req := connect.NewRequest(&paymentsv1.ChargeCardRequest{CustomerId: "cust_bomb", AmountCents: 100})
			req.Header().Set("Idempotency-Key", fmt.Sprintf("bomb-%d", i))
			_, errs[i] = client.ChargeCard(ctx, req)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted || reasonsOf(ce) != connectgate.ReasonRequestTooLarge {
			t.Fatalf("bomb %d: %v, want RESOURCE_EXHAUSTED with IDEMPOTENCY_REQUEST_TOO_LARGE\npayments-server log:\n%s", i, err, tool.Log())
		}
	}
	hwm := peakRSS(t, tool.Pid())
	t.Logf("payments-server VmHWM after %d bombs: %d MB", len(protocols), hwm>>20)
	if hwm > 200<<20 {
		t.Errorf("payments-server's peak resident memory %d MB after %d bombs, want under 200 MB", hwm>>20, len(protocols))
	}
	client := paymentsv1connect.NewPaymentsServiceClient(h2cClient(t), "http://"+connectAddr)
	for i := range protocols {
		req := connect.NewRequest(&paymentsv1.ChargeCardRequest{CustomerId: "cust_bomb", AmountCents: 100})
		req.Header().Set("Idempotency-Key", fmt.Sprintf("bomb-%d", i))
		resp, err := client.ChargeCard(ctx, req)
		if err != nil || resp.Header().Get("Idempotency-Replayed") != "" {
			t.Fatalf("a small charge with bomb %d's key: %v (headers %v), want it charged now, not a replay", i, err, resp)
		}
	}
}

// reasonsOf is the reasons of a connect error's ErrorInfo details, joined
// by commas.
func reasonsOf(ce *connect.Error) string {
	var reasons []string
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok {
				reasons = append(reasons, info.GetReason())
			}
		}
	}
	return strings.Join(reasons, ",")
}

// peakRSS is a process's peak resident memory (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read the process's status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

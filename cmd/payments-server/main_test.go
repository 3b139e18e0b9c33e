package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/httplimits"
)

func getenvFrom(env map[string]string) func(string) (string, bool) {
	return cliflag.Map(env)
}

// defaultHTTP is the Connect listener's limits by default, as documented.
var defaultHTTP = httplimits.Limits{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
	IdleTimeout: 2 * time.Minute, MaxConnections: 512, MaxConnectionsPerIP: 64}

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := parseConfig(nil, getenvFrom(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := config{listen: "127.0.0.1:50052", dedupeAddr: "127.0.0.1:50051", replayCacheBytes: 64 << 20, http: defaultHTTP}
	if cfg != want {
		t.Errorf("defaults = %+v, want %+v", cfg, want)
	}
	if got := cfg.replayCache(); got != "off" {
		t.Errorf("replay cache by default: %q, want off", got)
	}
}

func TestParseConfigReplayCache(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		env       map[string]string
		entries   int
		bytes     int
		startLine string
	}{
		{"flag, default bytes", []string{"-replay-cache-entries", "1000"}, nil, 1000, 64 << 20, "entries=1000 bytes=67108864 ttl=1m0s"},
		{"both flags", []string{"-replay-cache-entries=10", "-replay-cache-bytes=4096"}, nil, 10, 4096, "entries=10 bytes=4096 ttl=1m0s"},
		{"environment", nil, map[string]string{"PAYMENTS_REPLAY_CACHE_ENTRIES": "5", "PAYMENTS_REPLAY_CACHE_BYTES": "2048"}, 5, 2048, "entries=5 bytes=2048 ttl=1m0s"},
		{"a flag overrides the environment", []string{"-replay-cache-entries=0"}, map[string]string{"PAYMENTS_REPLAY_CACHE_ENTRIES": "5"}, 0, 64 << 20, "off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseConfig(tc.args, getenvFrom(tc.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.replayCacheEntries != tc.entries || cfg.replayCacheBytes != tc.bytes {
				t.Errorf("entries %d, bytes %d; want %d, %d", cfg.replayCacheEntries, cfg.replayCacheBytes, tc.entries, tc.bytes)
			}
			if got := cfg.replayCache(); got != tc.startLine {
				t.Errorf("start-up line says replay_cache=%q, want %q", got, tc.startLine)
			}
		})
	}
}

func TestParseConfigRefusesBadReplayCacheValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		// want is what the error must name.
		want string
	}{
		{"negative entries", []string{"-replay-cache-entries=-1"}, nil, "-replay-cache-entries"},
		{"zero bytes", []string{"-replay-cache-entries=10", "-replay-cache-bytes=0"}, nil, "-replay-cache-bytes"},
		{"negative bytes", []string{"-replay-cache-entries=10", "-replay-cache-bytes=-5"}, nil, "-replay-cache-bytes"},
		{"bytes without entries", []string{"-replay-cache-bytes=4096"}, nil, "-replay-cache-entries"},
		{"bytes from the environment without entries", nil, map[string]string{"PAYMENTS_REPLAY_CACHE_BYTES": "4096"}, "-replay-cache-entries"},
		{"unparsable entries variable", nil, map[string]string{"PAYMENTS_REPLAY_CACHE_ENTRIES": "many"}, "PAYMENTS_REPLAY_CACHE_ENTRIES"},
		{"unparsable bytes variable", nil, map[string]string{"PAYMENTS_REPLAY_CACHE_ENTRIES": "10", "PAYMENTS_REPLAY_CACHE_BYTES": "64MiB"}, "-replay-cache-bytes"},
		{"unparsable flag", []string{"-replay-cache-entries=lots"}, nil, "-replay-cache-entries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig(tc.args, getenvFrom(tc.env), io.Discard)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s", err, tc.want)
			}
		})
	}
}

func TestParseConfigOtherFlagsKeepTheirEnvironment(t *testing.T) {
	cfg, err := parseConfig(nil, getenvFrom(map[string]string{
		"PAYMENTS_LISTEN": "127.0.0.1:6000", "IDEMGATE_DEDUPE_ADDR": "127.0.0.1:6001",
		"IDEMGATE_DEDUPE_TOKEN": "tok", "PAYMENTS_REFLECTION": "true",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := config{listen: "127.0.0.1:6000", dedupeAddr: "127.0.0.1:6001", token: "tok", reflection: true, replayCacheBytes: 64 << 20, http: defaultHTTP}
	if cfg != want {
		t.Errorf("config = %+v, want %+v", cfg, want)
	}
}

// Every variable follows cliflag's rule: a bad one is an error naming it,
// its value and its flag, all of them together, unless the flag is given.
// PAYMENTS_REFLECTION=maybe read as false before.
func TestParseConfigEnvironmentFollowsTheOneRule(t *testing.T) {
	bad := map[string]string{"PAYMENTS_REFLECTION": "maybe", "PAYMENTS_REPLAY_CACHE_ENTRIES": "lots", "PAYMENTS_LISTEN": "127.0.0.1:6000"}
	_, err := parseConfig(nil, getenvFrom(bad), io.Discard)
	for _, want := range []string{`PAYMENTS_REFLECTION="maybe" (-reflection): `, `PAYMENTS_REPLAY_CACHE_ENTRIES="lots" (-replay-cache-entries): `} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("two bad variables: %v, want both reported, %s among them", err, want)
		}
	}
	cfg, err := parseConfig([]string{"-reflection=false", "-replay-cache-entries", "3"}, getenvFrom(bad), io.Discard)
	if err != nil || cfg.reflection || cfg.replayCacheEntries != 3 || cfg.listen != "127.0.0.1:6000" {
		t.Errorf("the bad variables' flags given: %+v, %v; want the flags to win and PAYMENTS_LISTEN read", cfg, err)
	}
	var usage strings.Builder
	if _, err := parseConfig([]string{"-h"}, getenvFrom(nil), &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"(env PAYMENTS_LISTEN)", "(env IDEMGATE_DEDUPE_ADDR)", "(env IDEMGATE_DEDUPE_TOKEN)", "(env PAYMENTS_REFLECTION)", "(env PAYMENTS_METRICS_LISTEN)"} {
		if strings.Count(usage.String(), want) != 1 {
			t.Errorf("usage:\n%s\nwant %s once", usage.String(), want)
		}
	}
}

func TestParseConfigHelp(t *testing.T) {
	var usage strings.Builder
	if _, err := parseConfig([]string{"-h"}, getenvFrom(nil), &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	for _, s := range []string{"PAYMENTS_REPLAY_CACHE_ENTRIES", "PAYMENTS_REPLAY_CACHE_BYTES", "(default 67108864)"} {
		if !strings.Contains(usage.String(), s) {
			t.Errorf("usage does not mention %s:\n%s", s, usage.String())
		}
	}
}

func TestParseConfigFinishAfterReply(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want bool
	}{
		{"default", nil, nil, false},
		{"flag", []string{"-finish-after-reply"}, nil, true},
		{"environment", nil, map[string]string{"PAYMENTS_FINISH_AFTER_REPLY": "true"}, true},
		{"a flag overrides the environment", []string{"-finish-after-reply=false"}, map[string]string{"PAYMENTS_FINISH_AFTER_REPLY": "1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseConfig(tc.args, getenvFrom(tc.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.finishAfterReply != tc.want {
				t.Errorf("finishAfterReply = %v, want %v", cfg.finishAfterReply, tc.want)
			}
		})
	}
	_, err := parseConfig(nil, getenvFrom(map[string]string{"PAYMENTS_FINISH_AFTER_REPLY": "soon"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "PAYMENTS_FINISH_AFTER_REPLY") || !strings.Contains(err.Error(), "-finish-after-reply") {
		t.Errorf("an unparsable PAYMENTS_FINISH_AFTER_REPLY: %v, want an error naming it and its flag", err)
	}
	var usage strings.Builder
	if _, err := parseConfig([]string{"-h"}, getenvFrom(nil), &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, s := range []string{"-finish-after-reply", "PAYMENTS_FINISH_AFTER_REPLY", "FINISH_POLICY_AFTER_REPLY"} {
		if !strings.Contains(usage.String(), s) {
			t.Errorf("usage does not mention %s:\n%s", s, usage.String())
		}
	}
}

// heldFinish is a Dedupe client that reserves every key and holds every
// Finish until release is closed, so a test sees whether the caller was
// answered before the outcome was stored.
type heldFinish struct {
	idemgatev1.DedupeServiceClient // nil: a call the gate should not make panics
	release                        chan struct{}
	finishing                      chan struct{} // receives when a Finish arrives
}

func (h *heldFinish) Begin(context.Context, *idemgatev1.BeginRequest, ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_Reserved_{Reserved: &idemgatev1.BeginResponse_Reserved{
		Epoch: 1, LeaseExpiresAt: timestamppb.New(time.Now().Add(time.Minute)),
	}}}, nil
}

func (h *heldFinish) Finish(ctx context.Context, _ *idemgatev1.FinishRequest, _ ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	h.finishing <- struct{}{}
	select {
	case <-h.release:
		return &idemgatev1.FinishResponse{}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func (h *heldFinish) Heartbeat(context.Context, *idemgatev1.HeartbeatRequest, ...grpc.CallOption) (*idemgatev1.HeartbeatResponse, error) {
	return &idemgatev1.HeartbeatResponse{LeaseExpiresAt: timestamppb.New(time.Now().Add(time.Minute))}, nil
}

// With -finish-after-reply a ChargeCard is answered while its Finish is
// held; without it, only once the Finish came back. SendReceipt keeps the
// proto's policy either way.
func TestFinishAfterReplyAnswersBeforeTheOutcomeIsStored(t *testing.T) {
	for _, afterReply := range []bool{true, false} {
		t.Run(fmt.Sprintf("finish-after-reply=%v", afterReply), func(t *testing.T) {
			cfg, err := parseConfig([]string{fmt.Sprintf("-finish-after-reply=%v", afterReply)}, getenvFrom(nil), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			dedupe := &heldFinish{release: make(chan struct{}), finishing: make(chan struct{}, 1)}
			gate, err := newGate(cfg, dedupe)
			if err != nil {
				t.Fatal(err)
			}
			if got := gate.Policy(paymentsv1.PaymentsService_ChargeCard_FullMethodName).FinishAfterReply; got != afterReply {
				t.Errorf("ChargeCard's policy says finish after reply %v, want %v", got, afterReply)
			}
			if p := gate.Policy(paymentsv1.PaymentsService_SendReceipt_FullMethodName); !p.Gated || p.FinishAfterReply {
				t.Errorf("SendReceipt's policy changed: %s", p)
			}
			srv := grpc.NewServer(grpc.UnaryInterceptor(gate.UnaryServerInterceptor()))
			paymentsv1.RegisterPaymentsServiceServer(srv, &payments.Server{Ledger: &payments.Ledger{}})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = srv.Serve(lis) }()
			defer srv.Stop()
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), idemgate.KeyHeader, "held-finish"), time.Minute)
			defer cancel()
			answered := make(chan error, 1)
			go func() {
				_, err := paymentsv1.NewPaymentsServiceClient(conn).ChargeCard(ctx, &paymentsv1.ChargeCardRequest{CustomerId: "cust_1", AmountCents: 100})
				answered <- err
			}()
			<-dedupe.finishing
			if afterReply {
				// The Finish stays held until after the answer: an answer that
				// waited for it never comes (the call's minute runs out).
				if err := <-answered; err != nil {
					t.Fatalf("ChargeCard while its Finish was held, with -finish-after-reply: %v", err)
				}
			} else {
				// No time bound proves an answer will not come; half a second
				// without one, on a machine that answers in milliseconds, is
				// the evidence (a starved machine only weakens it).
				select {
				case err := <-answered:
					t.Fatalf("ChargeCard was answered (%v) while its Finish was held, without -finish-after-reply", err)
				case <-time.After(500 * time.Millisecond):
				}
			}
			close(dedupe.release)
			if !afterReply {
				if err := <-answered; err != nil {
					t.Fatalf("ChargeCard after its Finish came back: %v", err)
				}
			}
			closeCtx, cancelClose := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancelClose()
			if err := gate.Close(closeCtx); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
}

func TestParseConfigMetricsListen(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, ""},
		{[]string{"-metrics-listen", "127.0.0.1:9464"}, nil, "127.0.0.1:9464"},
		{nil, map[string]string{"PAYMENTS_METRICS_LISTEN": "127.0.0.1:9465"}, "127.0.0.1:9465"},
		{[]string{"-metrics-listen="}, map[string]string{"PAYMENTS_METRICS_LISTEN": "127.0.0.1:9465"}, ""},
	} {
		cfg, err := parseConfig(c.args, getenvFrom(c.env), io.Discard)
		if err != nil || cfg.metricsListen != c.want {
			t.Errorf("parseConfig(%q, %v) = metrics at %q, %v; want %q", c.args, c.env, cfg.metricsListen, err, c.want)
		}
	}
}

func TestParseConfigDedupeInProcess(t *testing.T) {
	cfg, err := parseConfig([]string{"-dedupe", "in-process", "--", "-data-dir", "/tmp/x", "-caller-begin-rate=7", "-metrics-listen="},
		getenvFrom(map[string]string{"IDEMGATE_CALLER_MAX_RECORDS": "99"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.inProcess
	if d == nil {
		t.Fatal("-dedupe in-process left the in-process Dedupe service unconfigured")
	}
	if d.DataDir != "/tmp/x" || d.CallerBeginRate != 7 || d.CallerMaxRecords != 99 || d.MetricsListen != "" || d.DatabaseURL != "" {
		t.Errorf("in-process Dedupe config: data dir %q, rate %v, max records %d, metrics %q, database %q; want /tmp/x, 7, 99 (from the environment), off, none",
			d.DataDir, d.CallerBeginRate, d.CallerMaxRecords, d.MetricsListen, d.DatabaseURL)
	}
	if cfg, err := parseConfig(nil, getenvFrom(map[string]string{"IDEMGATE_DEDUPE_ADDR": "in-process", "DATABASE_URL": "postgres://db/x"}), io.Discard); err != nil || cfg.inProcess == nil || cfg.inProcess.DatabaseURL != "postgres://db/x" {
		t.Errorf("IDEMGATE_DEDUPE_ADDR=in-process with DATABASE_URL: %+v, %v; want the in-process service on that database", cfg.inProcess, err)
	}
	if cfg, err := parseConfig(nil, getenvFrom(nil), io.Discard); err != nil || cfg.inProcess != nil {
		t.Errorf("by default: in-process %+v, %v; want the Dedupe service at -dedupe", cfg.inProcess, err)
	}

	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"dedupesvc flags without in-process", []string{"-dedupe", "127.0.0.1:1", "--", "-data-dir", "/tmp/x"}, nil, `unexpected argument "-data-dir"`},
		{"a token for no service", []string{"-dedupe", "in-process", "-dedupe-token", "tok"}, nil, "-dedupe-token"},
		{"an unknown dedupesvc flag", []string{"-dedupe", "in-process", "--", "-no-such-flag"}, nil, "-no-such-flag"},
		{"a flag of dedupesvc's gRPC server", []string{"-dedupe", "in-process", "--", "-token-file", "/x"}, nil, "-token-file is set, but an embedded Dedupe service"},
		{"a bad dedupesvc variable", []string{"-dedupe", "in-process"}, map[string]string{"IDEMGATE_CALLER_BEGIN_BURST": "lots"}, "IDEMGATE_CALLER_BEGIN_BURST"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig(tc.args, getenvFrom(tc.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
	var usage strings.Builder
	if _, err := parseConfig([]string{"-dedupe", "in-process", "--", "-h"}, getenvFrom(nil), &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-dedupe in-process -- -h: %v, want flag.ErrHelp", err)
	}
	if !strings.Contains(usage.String(), "-caller-begin-rate") {
		t.Errorf("-dedupe in-process -- -h does not list the dedupesvc flags:\n%s", usage.String())
	}
}

package dedupeapp_test

// Tests of issue 30: one caller's flood cannot crowd out another's calls.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/keys"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// churnWatches keeps perIP unauthenticated Health.Watch connections open
// from each of ips, each closed and reopened after hold, until stop closes.
func churnWatches(addr string, ips []string, perIP int, hold time.Duration, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for _, ip := range ips {
		for range perIP {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
				for {
					select {
					case <-stop:
						return
					default:
					}
					c, err := d.Dial("tcp", addr)
					if err != nil {
						time.Sleep(time.Millisecond)
						continue
					}
					h := &h2conn{Conn: c, fr: http2.NewFramer(c, c)}
					_, _ = c.Write([]byte(http2.ClientPreface))
					_ = h.fr.WriteSettings()
					var block bytes.Buffer
					enc := hpack.NewEncoder(&block)
					for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/grpc.health.v1.Health/Watch"},
						{":authority", "dedupe"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
						_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
					}
					_ = h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true})
					_ = h.fr.WriteData(1, true, []byte{0, 0, 0, 0, 0})
					// Held until hold passes or the service closes it.
					end := time.Now().Add(hold)
					buf := make([]byte, 4096)
				read:
					for time.Now().Before(end) {
						select {
						case <-stop:
							break read
						default:
						}
						_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
						if _, err := c.Read(buf); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
							break
						}
					}
					_ = c.Close()
				}
			}()
		}
	}
	return &wg
}

// A tool server's new connection is never closed as a stranger's, however
// fast strangers' unauthenticated connections churn: each of its Begins,
// on a connection opened just for it, without WaitForReady (as a gate
// calls: fail fast), is answered. Before the fix about one run in two had
// a Begin refused UNAVAILABLE: the connection was evicted between its
// accept and its first call (issue 30, item 5).
func TestToolServerConnectionIsNotEvictedAsAStranger(t *testing.T) {
	addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokenFile(t), UnauthenticatedTimeout: time.Hour})
	beginWith(t, addr, clientSecret)
	var ips []string
	for i := 2; i <= 11; i++ {
		ips = append(ips, "127.0.0."+strconv.Itoa(i))
	}
	stop := make(chan struct{})
	wg := churnWatches(addr, ips, 52, time.Hour, stop)
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(time.Second) // let the churn fill the caps
	for i := range 20 {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), withToken(clientSecret),
			grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
				return d.DialContext(ctx, "tcp", a)
			}))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err = idemgatev1.NewDedupeServiceClient(conn).Begin(ctx, beginRequest("tool-"+strconv.Itoa(i)))
		cancel()
		_ = conn.Close()
		if err != nil {
			t.Fatalf("Begin %d on a tool server's new connection while 520 strangers' connections churn: %v", i, err)
		}
	}
}

// finishFlood opens n Finish streams on h as caller secret, each announcing
// a 1 MiB message and sending 16 KiB of it, never the rest, with extra
// headers; and returns the codes answered within a minute to want of them.
func finishFlood(t *testing.T, h *h2conn, n, want int, extra ...[2]string) map[uint32]codes.Code {
	t.Helper()
	extra = append(extra, [2]string{"authorization", "Bearer " + clientSecret})
	for i := range uint32(n) {
		h.bigRequest(t, 2*i+1, idemgatev1.DedupeService_Finish_FullMethodName, 1<<20, 16<<10, extra...)
	}
	return h.statuses(t, want, time.Minute)
}

// One caller's Finishes being read at once are bounded
// (-max-finish-bytes-in-flight): counted at the size the gate declares in
// idemgate-outcome-bytes, or at the largest outcome from a gate that does
// not declare it, the excess is refused RESOURCE_EXHAUSTED
// (DEDUPE_QUOTA_EXCEEDED) from its headers while the admitted megabytes
// are still incomplete, so 256 senders cannot make the service buffer 256
// of them (issue 30, item 4).
func TestFinishesInFlightPerCallerAreBounded(t *testing.T) {
	t.Parallel()
	const budget, streams = 4, 12 // MiB admitted at once; streams sent
	for _, tc := range []struct {
		name  string
		extra [][2]string
	}{
		{"declared", [][2]string{{"idemgate-outcome-bytes", strconv.Itoa(1 << 20)}}},
		{"undeclared (older gates)", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokenFile(t), MaxFinishBytesInFlight: budget << 20})
			beginWith(t, addr, clientSecret)
			h := dialH2From(t, "127.0.0.1", addr)
			got := finishFlood(t, h, streams, streams-budget, tc.extra...)
			refused := 0
			for _, code := range got {
				if code == codes.ResourceExhausted {
					refused++
				}
			}
			if refused < streams-budget {
				t.Fatalf("%d of %d incomplete 1 MiB Finishes of one caller refused from their headers within a minute (%v), want %d: past %d MiB in flight the service must not read them",
					refused, streams, got, streams-budget, budget)
			}
		})
	}
}

// A declared outcome size is taken from the caller's outcome-byte bucket
// as the Finish arrives, not only looked at: with a bucket of 4 MiB, of 12
// Finishes declaring 1 MiB each, arriving at once, 8 are refused from
// their headers, before the service reads a byte of them (before the fix
// every one passed the tap's look, and each megabyte was read before most
// were refused).
func TestDeclaredFinishBytesAreTakenAsTheyArrive(t *testing.T) {
	t.Parallel()
	addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokenFile(t),
		CallerOutcomeByteRate: 1, CallerOutcomeByteBurst: 4 << 20, MaxFinishBytesInFlight: 64 << 20})
	beginWith(t, addr, clientSecret)
	h := dialH2From(t, "127.0.0.1", addr)
	got := finishFlood(t, h, 12, 8, [2]string{"idemgate-outcome-bytes", strconv.Itoa(1 << 20)})
	refused := 0
	for _, code := range got {
		if code == codes.ResourceExhausted {
			refused++
		}
	}
	if refused < 8 {
		t.Fatalf("%d of 12 incomplete Finishes declaring 1 MiB against a 4 MiB bucket refused from their headers (%v), want 8", refused, got)
	}
}

// headersOf reads frames from h until the response headers of a stream
// arrive, or fails.
func headersOf(t *testing.T, h *h2conn) {
	t.Helper()
	_ = h.SetReadDeadline(time.Now().Add(time.Minute))
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			t.Fatalf("a stranger's Health.Watch was not answered: %v", err)
		}
		if _, ok := f.(*http2.HeadersFrame); ok {
			return
		}
	}
}

// A tool server's connection that has not sent its first call yet is not
// evicted while connections that showed themselves as strangers (a
// Health.Watch without credentials) remain, even from the same address
// (one host, or a NAT or proxy in front of both): before the fix the
// per-IP cap closed the oldest connection of the address, the tool
// server's, whose Begin then failed UNAVAILABLE (issue 30, item 5).
func TestToolServerConnectionOutlivesStrangersOfItsAddress(t *testing.T) {
	t.Parallel()
	const perIP = 4
	addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokenFile(t), UnauthenticatedTimeout: time.Hour,
		MaxUnauthenticatedConnectionsPerIP: perIP})
	beginWith(t, addr, clientSecret)
	tool := dialH2From(t, "127.0.0.5", addr) // connected, no call yet
	for range perIP {
		h := dialH2From(t, "127.0.0.5", addr)
		h.watch(t, 1)
		headersOf(t, h) // accepted and admitted by now
	}
	// The tool server's first call: a Health.Check with its token.
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/grpc.health.v1.Health/Check"},
		{":authority", "dedupe"}, {"content-type", "application/grpc"}, {"te", "trailers"}, {"authorization", "Bearer " + clientSecret}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := tool.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
		t.Fatalf("the tool server's connection was closed: %v", err)
	}
	_ = tool.fr.WriteData(1, true, []byte{0, 0, 0, 0, 0})
	got := tool.statuses(t, 1, time.Minute)
	if code, ok := got[1]; !ok || code != codes.OK {
		t.Fatalf("the tool server's first call on a connection opened before %d strangers' from its address: %v, want OK (closed as a stranger's)", perIP, got)
	}
}

// A caller that ignores RetryInfo and keeps sending Finishes its outcome
// byte rate cannot take is paced by its own connection: each refusal holds
// that connection's reader for the retry delay (at most 100ms here), so
// over any stretch its refusals number at most one per hold, plus the calls
// already in flight, however fast it sends; before the fix a refusal came
// back at once and a flood of them cost the service each stream and the data
// it carried (a neighbour kept 14% of its Begins; issue 30, item 4). A
// neighbour on its own connection is answered meanwhile.
func TestRefusedFinishesArePacedByTheirConnection(t *testing.T) {
	// A rate of 1 KiB/s: once the burst is spent, each declared 64 KiB
	// Finish is a minute short, so its delay is the hold's cap.
	tokens := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, tokens, "payments client "+clientSecret+"\nneighbour client neighbour-secret-0123456789\n")
	addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokens,
		CallerOutcomeByteRate: 1024, CallerOutcomeByteBurst: 1, MaxOutcomeBytes: 1 << 20})
	conn := dial(t, addr, withToken(clientSecret))
	ctx := callCtx(t)
	flood := idemgatev1.NewDedupeServiceClient(conn)
	outcome := &anypb.Any{TypeUrl: "type.googleapis.com/flood.V", Value: make([]byte, 64<<10)}
	declared := strconv.Itoa(len(outcome.TypeUrl) + len(outcome.Value))
	const senders = 4
	var refused, other atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	start := time.Now()
	for s := range senders {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := flood.Finish(metadata.AppendToOutgoingContext(ctx, keys.OutcomeBytesHeader, declared), &idemgatev1.FinishRequest{Scope: "/x.S/M", Key: fmt.Sprintf("f%d-%d", s, n), AttemptToken: "a", Epoch: 1, Outcome: outcome})
				if status.Code(err) == codes.ResourceExhausted {
					refused.Add(1)
				} else {
					other.Add(1)
				}
			}
		})
	}
	// The neighbour, another caller on its own connection, is answered
	// while the flood's connection is held.
	neighbour := idemgatev1.NewDedupeServiceClient(dial(t, addr, withToken("neighbour-secret-0123456789")))
	for i := range 5 {
		if _, err := neighbour.Begin(callCtx(t), beginRequest("neighbour-"+strconv.Itoa(i))); err != nil {
			t.Fatalf("neighbour's Begin %d during the flood: %v", i, err)
		}
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	// The holds run one after another on the connection's reader.
	if most := int64(elapsed/(100*time.Millisecond)) + senders; refused.Load() > most {
		t.Fatalf("%d Finishes refused in %s on one connection (%d otherwise answered): more than one per 100ms hold plus the %d in flight (%d); the refusals are not paced",
			refused.Load(), elapsed.Round(time.Millisecond), other.Load(), senders, most)
	}
	if refused.Load() == 0 {
		t.Fatalf("no Finish refused for its byte rate (%d otherwise answered): the test sends within the rate", other.Load())
	}
}

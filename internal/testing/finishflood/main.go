// Command finishflood measures what one tenant's flood of large Finishes
// for keys it never reserved costs another tenant's Begins (issue 30, item
// 4): it starts a dedupesvc binary on 127.0.0.1 with the embedded store,
// runs -flooders senders of -size byte Finishes as tenant "flood" and one
// neighbour making Begins one after another as tenant "neighbour" for
// -duration, then prints the neighbour's Begin p50/p99, the flood's
// answers, and the service's CPU seconds and peak RSS. Loopback only,
// bounded in time.
//
//	go run ./internal/testing/finishflood -bin /tmp/dedupesvc -flooders 32
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/keys"
)

func main() {
	bin := flag.String("bin", "", "dedupesvc binary")
	flooders := flag.Int("flooders", 32, "concurrent Finish senders")
	size := flag.Int("size", 1<<20-64, "outcome value bytes")
	duration := flag.Duration("duration", 10*time.Second, "how long to measure")
	declare := flag.Bool("declare", true, "send idemgate-outcome-bytes, as a gate does")
	floodAddr := flag.String("flood-only", "", "internal: flood the service at this address until killed")
	// On one machine the flood's own client competes for the cores the
	// service and the neighbour use, which a real attacker on another
	// machine does not: run the tool under taskset -c 0 and the flood with
	// -flood-cpus 1 to keep them apart.
	floodCPUs := flag.String("flood-cpus", "", "run the flood's process under taskset -c with this CPU list")
	flag.Parse()
	if *floodAddr != "" {
		flood(*floodAddr, *flooders, *size, *declare)
		return
	}
	dir, err := os.MkdirTemp("", "finishflood")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("flood client flood-secret-0123456789abcdef\nneighbour client neighbour-secret-0123456789abcdef\n"), 0o600); err != nil {
		log.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	cmd := exec.Command(*bin, "-listen", addr, "-data-dir", filepath.Join(dir, "data"), "-token-file", tokens, "-metrics-listen", "")
	cmd.Stderr = nil
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	neighbour := client(addr, "neighbour-secret-0123456789abcdef")
	ctx, cancel := context.WithTimeout(context.Background(), *duration+time.Minute)
	defer cancel()
	for start := time.Now(); ; {
		c, cc := context.WithTimeout(ctx, time.Second)
		_, err := neighbour.Begin(c, begin("warm"))
		cc()
		if err == nil {
			break
		}
		if time.Since(start) > 30*time.Second {
			log.Fatalf("service not up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cpu0 := cpuSeconds(cmd.Process.Pid)
	// The flood runs in its own process, so its marshalling and garbage
	// do not slow the neighbour's client.
	var fl *exec.Cmd
	if *flooders > 0 {
		args := []string{os.Args[0], "-flood-only", addr, "-flooders", strconv.Itoa(*flooders), "-size", strconv.Itoa(*size), "-declare=" + strconv.FormatBool(*declare)}
		if *floodCPUs != "" {
			args = append([]string{"taskset", "-c", *floodCPUs}, args...)
		}
		fl = exec.Command(args[0], args[1:]...)
		fl.Stdout = os.Stdout
		if err := fl.Start(); err != nil {
			log.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	var lat []time.Duration
	var failed int
	end := time.Now().Add(*duration)
	for i := 0; time.Now().Before(end); i++ {
		t0 := time.Now()
		c, cc := context.WithTimeout(ctx, 10*time.Second)
		_, err := neighbour.Begin(c, begin("n"+strconv.Itoa(i)))
		cc()
		if err != nil {
			failed++
			continue
		}
		lat = append(lat, time.Since(t0))
	}
	cpu1 := cpuSeconds(cmd.Process.Pid)
	hwm := peakRSS(cmd.Process.Pid)
	if fl != nil {
		_ = fl.Process.Signal(os.Interrupt)
		_ = fl.Wait()
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(float64(len(lat))*p))]
	}
	fmt.Printf("flood-cpus=%q flooders=%d declare=%v size=%d duration=%s: neighbour Begins %d ok %d failed, p50 %s p99 %s max %s; dedupesvc CPU %.2fs in %s (%.0f%%), peak RSS %s\n",
		*floodCPUs, *flooders, *declare, *size, *duration, len(lat), failed, pct(0.50).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond), pct(1).Round(10*time.Microsecond),
		cpu1-cpu0, *duration, 100*(cpu1-cpu0)/duration.Seconds(), hwm)
}

// flood sends Finishes of size-byte outcomes from flooders senders as
// tenant "flood" until interrupted, then prints their answers.
func flood(addr string, flooders, size int, declare bool) {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	stop := ctx.Done()
	var (
		wg            sync.WaitGroup
		sent, refused atomic.Int64
		codes         sync.Map
	)
	value := make([]byte, size)
	_, _ = rand.Read(value)
	outcome := &anypb.Any{TypeUrl: "type.googleapis.com/flood.V", Value: value}
	// A few connections, as a fleet of gates would open.
	floods := make([]idemgatev1.DedupeServiceClient, 8)
	for i := range floods {
		floods[i] = client(addr, "flood-secret-0123456789abcdef")
	}
	for i := range flooders {
		wg.Go(func() {
			f := floods[i%len(floods)]
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				c := ctx
				if declare {
					c = metadata.AppendToOutgoingContext(c, keys.OutcomeBytesHeader, strconv.Itoa(len(outcome.TypeUrl)+len(outcome.Value)))
				}
				c, cc := context.WithTimeout(c, 10*time.Second)
				_, err := f.Finish(c, &idemgatev1.FinishRequest{Scope: "/flood.S/M", Key: fmt.Sprintf("f%d-%d", i, n), AttemptToken: "t", Epoch: 1, Outcome: outcome})
				cc()
				sent.Add(1)
				if err != nil {
					refused.Add(1)
					code := status.Code(err).String()
					v, _ := codes.LoadOrStore(code, new(atomic.Int64))
					v.(*atomic.Int64).Add(1)
					if status.Code(err).String() == "ResourceExhausted" {
						time.Sleep(time.Millisecond) // a flooder ignoring RetryInfo, nearly
					}
				}
			}
		})
	}
	wg.Wait()
	var byCode []string
	codes.Range(func(k, v any) bool {
		byCode = append(byCode, fmt.Sprintf("%s=%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	slices.Sort(byCode)
	fmt.Printf("flood: %d Finishes sent, %d refused (%s)\n", sent.Load(), refused.Load(), strings.Join(byCode, " "))
}

func client(addr, secret string) idemgatev1.DedupeServiceClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+secret), method, req, reply, cc, opts...)
		}))
	if err != nil {
		log.Fatal(err)
	}
	return idemgatev1.NewDedupeServiceClient(conn)
}

func begin(key string) *idemgatev1.BeginRequest {
	return &idemgatev1.BeginRequest{Scope: "/n.S/M", Key: key, Fingerprint: make([]byte, 32), AttemptToken: "a",
		Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)}
}

// cpuSeconds is pid's user+system CPU time (/proc/pid/stat, clock ticks of
// 1/100 s).
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100
}

// peakRSS is pid's VmHWM.
func peakRSS(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			return strings.Join(strings.Fields(line)[1:], " ")
		}
	}
	return "?"
}

// Command connect-bomb sends over-size ChargeCard requests to a payments
// server's Connect listener, on 127.0.0.1 only, and reports what each got
// and, given the server's pid, its peak resident memory (VmHWM) and the CPU
// seconds it spent:
//
//	connect-bomb -addr 127.0.0.1:8091 -pid PID -mode gzip -size 268435456 -n 4
//	connect-bomb -addr 127.0.0.1:8091 -pid PID -mode plain -size 67108864 -n 1
//
// -mode gzip sends a gzip body (about 1/1000 of -size) that inflates to a
// -size customer_id; -mode plain sends the -size customer_id as it is. The
// -n requests go at once, over the Connect protocol, each with its own key.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/gen/examples/payments/v1/paymentsv1connect"
	"github.com/idemgate/idemgate/internal/testing/connectbomb"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8091", "the Connect listener, on 127.0.0.1")
	pid := flag.Int("pid", 0, "the server's pid, to read its VmHWM and CPU time (0: none)")
	mode := flag.String("mode", "gzip", "gzip or plain")
	size := flag.Int("size", 256<<20, "bytes of the customer_id")
	n := flag.Int("n", 1, "requests sent at once (at most 16)")
	flag.Parse()
	if host, _, err := net.SplitHostPort(*addr); err != nil || host != "127.0.0.1" {
		log.Fatalf("-addr %s: only 127.0.0.1", *addr)
	}
	if *n < 1 || *n > 16 {
		log.Fatalf("-n %d: 1 to 16", *n)
	}
	var opts []connect.ClientOption
	customer := "cust_bomb"
	switch *mode {
	case "gzip":
		bomb := connectbomb.Gzip(*size, connectbomb.ChargeAmount)
		fmt.Printf("gzip body %d bytes, inflating to a %d-byte customer_id\n", len(bomb), *size)
		opts = connectbomb.ClientOptions(bomb)
	case "plain":
		customer = strings.Repeat("a", *size)
	default:
		log.Fatalf("-mode %s: gzip or plain", *mode)
	}
	cpu0 := cpuSeconds(*pid)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client := paymentsv1connect.NewPaymentsServiceClient(&http.Client{}, "http://"+*addr, opts...)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range *n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := connect.NewRequest(&paymentsv1.ChargeCardRequest{CustomerId: customer, AmountCents: 100})
			req.Header().Set("Idempotency-Key", fmt.Sprintf("bomb-%d-%d", time.Now().UnixNano(), i))
			began := time.Now()
			resp, err := client.ChargeCard(ctx, req)
			took := time.Since(began).Round(time.Millisecond)
			if err != nil {
				msg := err.Error()
				if len(msg) > 160 {
					msg = msg[:160] + "..."
				}
				fmt.Printf("request %d: %v after %v: %s\n", i, connect.CodeOf(err), took, msg)
				return
			}
			fmt.Printf("request %d: charged %s after %v\n", i, resp.Msg.GetChargeId(), took)
		}()
	}
	wg.Wait()
	fmt.Printf("all %d answered in %v\n", *n, time.Since(start).Round(time.Millisecond))
	if *pid > 0 {
		fmt.Printf("server VmHWM %s, CPU %.2fs during the attack\n", vmHWM(*pid), cpuSeconds(*pid)-cpu0)
	}
}

// vmHWM is the process's peak resident memory, as /proc/PID/status says it.
func vmHWM(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err.Error()
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// cpuSeconds is the process's user and system CPU time, from
// /proc/PID/stat (clock ticks of 1/100 s).
func cpuSeconds(pid int) float64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100
}

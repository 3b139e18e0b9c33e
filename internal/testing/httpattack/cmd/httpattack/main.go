// Command httpattack measures one attack on a listener the project ships,
// end to end, only against loopback: a neighbour's legitimate calls from
// -neighbour-src for -duration alone, then under the attack from -src,
// with the server's (-pid) descriptors, RSS and CPU seconds sampled from
// /proc before, during and after.
//
//	httpattack -target rest|connect|mcp -addr 127.0.0.1:8090 -pid 1234 -attack slowloris|idle|noread -n 1100
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/internal/testing/httpattack"
)

func main() {
	target := flag.String("target", "rest", "rest (rest-payments), connect (payments-server -connect-listen) or mcp (idemgate-mcp)")
	addr := flag.String("addr", "127.0.0.1:8090", "the listener, on loopback")
	pid := flag.Int("pid", 0, "the server's process id, to sample /proc")
	attack := flag.String("attack", "slowloris", "slowloris, idle or noread")
	n := flag.Int("n", 100, "attacking connections")
	src := flag.String("src", "127.0.0.1", "the attacker's source address")
	nsrc := flag.String("neighbour-src", "127.0.0.2", "the neighbour's source address")
	d := flag.Duration("duration", 10*time.Second, "each neighbour run")
	settle := flag.Duration("settle", 5*time.Second, "wait after opening the attack")
	token := flag.String("token", "", "bearer token for rest's calls")
	big := flag.Int("big", 3<<20, "bytes of the customer id a noread call sends (and is answered)")
	linger := flag.Duration("linger", 0, "sample the server once more this long after the attack ends")
	flag.Parse()
	if !strings.HasPrefix(*addr, "127.") {
		fmt.Fprintln(os.Stderr, "loopback only")
		os.Exit(2)
	}
	ctx := context.Background()
	legit, attackReq := requests(*target, *addr, *token, *big)
	client := httpattack.Client(*nsrc, 30*time.Second)
	neighbour := func(label string) {
		ok, failed, slowest := httpattack.Neighbour(ctx, *d, func(ctx context.Context, i int) error {
			req := legit(ctx, i)
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			if resp.StatusCode >= 300 {
				return fmt.Errorf("%s", resp.Status)
			}
			return nil
		})
		fmt.Printf("%-8s neighbour: %d ok, %d failed in %s (slowest %s)  %s\n", label, ok, failed, *d, slowest.Round(time.Millisecond), sample(*pid))
	}
	fmt.Printf("start    %s\n", sample(*pid))
	neighbour("alone")
	start := time.Now()
	var p *httpattack.Pool
	switch *attack {
	case "slowloris":
		head := attackReq
		if i := bytes.Index(head, []byte("\r\n\r\n")); i >= 0 {
			head = append(head[:i:i], []byte("\r\n\r\n")...)
		}
		head = bytes.Replace(head, []byte("Content-Length: "), []byte("Content-Length: 1"), 1) // longer than what is sent
		p = httpattack.Slowloris(ctx, *src, *addr, *n, head, 10*time.Second)
	case "idle":
		var answered int
		p, answered = httpattack.IdleKeepAlives(ctx, *src, *addr, *n, attackReq)
		fmt.Printf("idle: %d of %d answered\n", answered, *n)
	case "noread":
		p = httpattack.NeverRead(ctx, *src, *addr, *n, attackReq)
	}
	fmt.Printf("opened   %d (%d dials failed) in %s\n", p.Opened.Load(), p.Failed.Load(), time.Since(start).Round(time.Millisecond))
	time.Sleep(*settle)
	fmt.Printf("attack   open %d  %s\n", p.Open(), sample(*pid))
	neighbour("attacked")
	fmt.Printf("attack   open %d  %s\n", p.Open(), sample(*pid))
	p.Close()
	time.Sleep(5 * time.Second)
	fmt.Printf("closed+5s %s\n", sample(*pid))
	if *linger > 0 {
		time.Sleep(*linger)
		fmt.Printf("closed+%s %s\n", *linger+5*time.Second, sample(*pid))
	}
}

// requests returns the target's legitimate call and the attack's request.
func requests(target, addr, token string, big int) (func(context.Context, int) *http.Request, []byte) {
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	bigID := strings.Repeat("c", big)
	switch target {
	case "rest":
		auth := []string{"Content-Type: application/json", `Idempotency-Key: "attack"`}
		if token != "" {
			auth = append(auth, "Authorization: Bearer "+token)
		}
		return func(ctx context.Context, i int) *http.Request {
			r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/charges", strings.NewReader(`{"customer":"cus_1","amount":1999,"currency":"usd"}`))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Idempotency-Key", `"n-`+run+`-`+strconv.Itoa(i)+`"`)
			if token != "" {
				r.Header.Set("Authorization", "Bearer "+token)
			}
			return r
		}, httpattack.Request(http.MethodPost, "/charges", addr, auth, []byte(`{"customer":"cus_1","amount":1999,"currency":"usd"}`))
	case "connect":
		const path = "/examples.payments.v1.PaymentsService/"
		return func(ctx context.Context, i int) *http.Request {
				r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path+"ChargeCard", strings.NewReader(`{"customerId":"c","amountCents":5}`))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Idempotency-Key", "n-"+run+"-"+strconv.Itoa(i))
				return r
			}, httpattack.Request(http.MethodPost, path+"GetBalance", addr, []string{"Content-Type: application/json"},
				fmt.Appendf(nil, `{"customerId":%q}`, bigID))
	default: // mcp
		call := func(name string, args map[string]any, meta map[string]any) []byte {
			params := map[string]any{"name": "examples.payments.v1.PaymentsService." + name, "arguments": args}
			if meta != nil {
				params["_meta"] = meta
			}
			b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
			return b
		}
		headers := []string{"Content-Type: application/json", "Accept: application/json, text/event-stream", "MCP-Protocol-Version: 2025-06-18"}
		return func(ctx context.Context, i int) *http.Request {
				r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/mcp", bytes.NewReader(call("ChargeCard",
					map[string]any{"customerId": "c", "amountCents": 5}, map[string]any{"io.idemgate/idempotency-key": "n-" + run + "-" + strconv.Itoa(i)})))
				for _, h := range headers {
					k, v, _ := strings.Cut(h, ": ")
					r.Header.Set(k, v)
				}
				return r
			}, httpattack.Request(http.MethodPost, "/mcp", addr, headers,
				call("GetBalance", map[string]any{"customerId": bigID}, nil))
	}
}

// sample reads the process's descriptors, RSS and CPU seconds from /proc.
func sample(pid int) string {
	if pid == 0 {
		return ""
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	rss := ""
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			rss = strings.Join(strings.Fields(line)[1:], " ")
		}
	}
	stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	cpu := 0.0
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
		f := strings.Fields(string(stat[i+2:]))
		if len(f) > 13 {
			ut, _ := strconv.ParseFloat(f[11], 64)
			st, _ := strconv.ParseFloat(f[12], 64)
			cpu = (ut + st) / 100 // USER_HZ
		}
	}
	return fmt.Sprintf("[fds %d, rss %s, cpu %.2fs]", len(fds), rss, cpu)
}

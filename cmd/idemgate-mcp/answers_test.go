package main_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/mcpwire"
	"github.com/idemgate/idemgate/internal/testing/httpattack"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// answerMemory is what docs/mcp.md says a held answer costs the bridge, in
// bytes of memory per byte of answer, the garbage collector's headroom
// included: the bound on what -max-answer-bytes of answers take.
const answerMemory = 8

// bigBalances answers GetBalance for the customer "big" with a customer
// id of its own, which the answer carries twice (text and
// structuredContent): a large answer to a call of a few bytes.
type bigBalances struct {
	*payments.Server
	id string
}

func (b bigBalances) GetBalance(ctx context.Context, req *paymentsv1.GetBalanceRequest) (*paymentsv1.GetBalanceResponse, error) {
	if req.GetCustomerId() == "big" {
		return &paymentsv1.GetBalanceResponse{CustomerId: b.id}, nil
	}
	return b.Server.GetBalance(ctx, req)
}

// bigBalance calls GetBalance of the customer "big" through the bridge at
// url, from the source address src, reading the whole answer.
func bigBalance(ctx context.Context, src, url string) (*mcp.CallToolResult, error) {
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: httpattack.Client(src, 2*time.Minute)}, nil)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	return cs.CallTool(ctx, &mcp.CallToolParams{
		Name:      "examples.payments.v1.PaymentsService.GetBalance",
		Arguments: map[string]any{"customerId": "big"},
	})
}

// text is a result's first text, or "".
func text(res *mcp.CallToolResult) string {
	if res == nil || len(res.Content) == 0 {
		return ""
	}
	t, _ := res.Content[0].(*mcp.TextContent)
	if t == nil {
		return ""
	}
	return t.Text
}

// summary describes a result in a line: an error's text, or the size of
// an answer's.
func summary(res *mcp.CallToolResult) string {
	switch {
	case res == nil:
		return "no result"
	case res.IsError:
		return fmt.Sprintf("error %q", text(res))
	}
	return fmt.Sprintf("an answer of %d bytes of text", len(text(res)))
}

// procStatus is a field of /proc/<pid>/status in bytes (VmRSS, VmHWM).
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read the bridge's status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("%s %q: %v", field, v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// Callers that never read their answers hold at most the answer budget of
// the bridge, and a neighbour is served beside them (issue 40 item 3): 24
// connections from three addresses, each asking for a 6 MiB answer and
// reading none of it, held every answer until the write timeout (626 MB
// peak RSS from 63 MB), and an attacking address's own calls were answered
// all the same. Now each address holds at most -max-answer-bytes-per-ip of
// answers and all at most -max-answer-bytes; the calls past it are answered
// MCP_ANSWER_BUDGET_EXHAUSTED at once, so the bridge's peak memory stays
// within its baseline and answerMemory times -max-answer-bytes (185 MB from
// 55 MB), an attacking address's next call is refused, and a neighbour's
// large answers, read, are served.
func TestUnreadAnswersStayWithinTheAnswerBudget(t *testing.T) {
	t.Parallel()
	const (
		// The answer carries the id twice: just under 6 MiB, more than the
		// kernel takes into a connection's send buffer (at most 4 MiB), so
		// the bridge's write of it waits for the reader.
		idBytes = 3<<20 - 1<<10
		perIP   = 7 << 20  // -max-answer-bytes-per-ip: one answer
		total   = 24 << 20 // -max-answer-bytes: the attackers' three and the neighbour's
		addrs   = 3        // attacking addresses, 127.0.0.2 on
		conns   = 8        // never-reading connections from each
		slack   = 32 << 20 // connections, goroutines, the runtime's own growth
	)
	stack := stacktest.StartEmbedded(t, func(s *grpc.Server) {
		paymentsv1.RegisterPaymentsServiceServer(s, bigBalances{Server: &payments.Server{Ledger: &payments.Ledger{}}, id: strings.Repeat("b", idBytes)})
		reflection.Register(s)
	}, stacktest.Config{})
	addr := stacktest.FreeAddr(t)
	// A write timeout past the test: the attackers' answers stay held
	// while it measures.
	bridge := proctest.Start(t, proctest.Build(t, "."), []string{"-target", stack.Tool.Target(), "-plaintext", "-listen", addr,
		"-max-answer-bytes", strconv.Itoa(total), "-max-answer-bytes-per-ip", strconv.Itoa(perIP), "-write-timeout", "10m"}, nil)
	bridge.WaitTCP(t, addr, 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url := "http://" + addr + "/mcp"

	// The neighbour's first call builds what every call needs (the bridge's
	// baseline).
	if res, err := bigBalance(ctx, "127.0.0.1", url); err != nil || res.IsError {
		t.Fatalf("the neighbour's call before the attack: %v %+v", err, res)
	}
	base := procStatus(t, bridge.Pid(), "VmRSS")

	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"examples.payments.v1.PaymentsService.GetBalance","arguments":{"customerId":"big"}}}`
	call := httpattack.Request(http.MethodPost, "/mcp", addr, mcpHeaders, []byte(body))
	for i := range addrs {
		attack := httpattack.NeverRead(ctx, fmt.Sprintf("127.0.0.%d", i+2), addr, conns, call)
		defer attack.Close()
		if attack.Failed.Load() > 0 {
			t.Fatalf("%d of attacker %d's connections failed", attack.Failed.Load(), i)
		}
		// Every call answered: held, or refused.
		if err := attack.WaitAnswering(2 * time.Minute); err != nil {
			t.Fatalf("attacker %d: %v", i, err)
		}
	}

	for i := range 3 {
		res, err := bigBalance(ctx, "127.0.0.1", url)
		if err != nil || res.IsError || len(text(res)) < idBytes {
			t.Errorf("the neighbour's call %d beside %d unread answers: %v, %s; want its answer", i, addrs*conns, err, summary(res))
		}
	}
	// An attacking address's own call, read, is refused: its unread
	// answer holds its share.
	res, err := bigBalance(ctx, "127.0.0.2", url)
	if err != nil {
		t.Fatalf("a read call from an attacking address: %v", err)
	}
	if e, _ := res.Meta[mcpbridge.MetaError].(map[string]any); !res.IsError || e["reason"] != mcpwire.ReasonAnswerBudgetExhausted || e["advice"] != mcpbridge.AdviceRetrySameKey {
		t.Errorf("a read call from an attacking address: %s, want %s, advice %s", summary(res), mcpwire.ReasonAnswerBudgetExhausted, mcpbridge.AdviceRetrySameKey)
	}

	peak := procStatus(t, bridge.Pid(), "VmHWM")
	bound := base + answerMemory*total + slack
	t.Logf("the bridge: %d MB resident before the attack, peak %d MB beside %d unread answers of %d KiB; bound %d MB", base>>20, peak>>20, addrs*conns, 2*idBytes>>10, bound>>20)
	if peak > bound {
		t.Errorf("the bridge's peak resident memory %d MB beside %d unread answers of %d KiB, want under %d MB (%d MB before, and %d times -max-answer-bytes %d MiB, and %d MB)",
			peak>>20, addrs*conns, 2*idBytes>>10, bound>>20, base>>20, answerMemory, total>>20, slack>>20)
	}
}

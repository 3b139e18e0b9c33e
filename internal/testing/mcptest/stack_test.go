package mcptest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/proto"

	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

const (
	bridgePkg   = "github.com/idemgate/idemgate/cmd/idemgate-mcp"
	dedupePkg   = "github.com/idemgate/idemgate/cmd/dedupesvc"
	paymentsPkg = "github.com/idemgate/idemgate/cmd/payments-server"

	chargeTool  = "examples.payments.v1.PaymentsService.ChargeCard"
	receiptTool = "examples.payments.v1.PaymentsService.SendReceipt"
	balanceTool = "examples.payments.v1.PaymentsService.GetBalance"

	// startTimeout is generous: the binaries start inside it on a loaded
	// 2-core machine. Not a timing assertion.
	startTimeout = 2 * time.Minute
)

// stack is the real dedupesvc binary (embedded store) and the real
// payments-server binary gated by it, plus what a bridge needs to serve it.
type stack struct {
	paymentsAddr  string
	payments      *proctest.Process
	descriptorSet string
	bridgeBin     string
}

func startStack(t *testing.T) *stack {
	t.Helper()
	dir := t.TempDir()
	dedupeAddr := stacktest.FreeAddr(t)
	proctest.Start(t, proctest.Build(t, dedupePkg),
		[]string{"-listen", dedupeAddr, "-data-dir", filepath.Join(dir, "data"), "-metrics-listen", stacktest.FreeAddr(t)},
		[]string{"DATABASE_URL="}).WaitTCP(t, dedupeAddr, startTimeout)
	s := &stack{paymentsAddr: stacktest.FreeAddr(t), bridgeBin: proctest.Build(t, bridgePkg)}
	s.payments = proctest.Start(t, proctest.Build(t, paymentsPkg),
		[]string{"-listen", s.paymentsAddr, "-dedupe", dedupeAddr}, nil)
	s.payments.WaitTCP(t, s.paymentsAddr, startTimeout)

	// The descriptor set a user would build with buf build -o, from the
	// descriptors linked into this test.
	b, err := proto.Marshal(mcpbridge.FileSet(paymentsv1.File_examples_payments_v1_payments_proto))
	if err != nil {
		t.Fatal(err)
	}
	s.descriptorSet = filepath.Join(dir, "payments.binpb")
	if err := os.WriteFile(s.descriptorSet, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// bridgeArgs are the bridge's flags for the stack's payments server.
func (s *stack) bridgeArgs(extra ...string) []string {
	return append([]string{"-target", s.paymentsAddr, "-plaintext", "-descriptor-set", s.descriptorSet}, extra...)
}

// startHTTPBridge runs the bridge binary serving streamable HTTP and returns
// its endpoint.
func (s *stack) startHTTPBridge(t *testing.T) string {
	t.Helper()
	addr := stacktest.FreeAddr(t)
	proctest.Start(t, s.bridgeBin, s.bridgeArgs("-listen", addr), nil).WaitTCP(t, addr, startTimeout)
	return "http://" + addr + "/mcp"
}

// transports are the two ways an MCP client reaches the bridge binary.
type transport struct {
	name    string
	connect func(t *testing.T, s *stack) mcp.Transport
}

func transports() []transport {
	return []transport{
		{"stdio", func(t *testing.T, s *stack) mcp.Transport {
			return &mcp.CommandTransport{Command: commandFor(t, s.bridgeBin, s.bridgeArgs()...)}
		}},
		{"http", func(t *testing.T, s *stack) mcp.Transport {
			return &mcp.StreamableClientTransport{Endpoint: s.startHTTPBridge(t), MaxRetries: -1}
		}},
	}
}

// connectGo connects the go-sdk client through tr.
func connectGo(t *testing.T, s *stack, tr transport) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "mcptest", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	session, err := client.Connect(ctx, tr.connect(t, s), nil)
	if err != nil {
		t.Fatalf("%s: connect: %v", tr.name, err)
	}
	t.Cleanup(func() { _ = session.Close() })
	return session
}

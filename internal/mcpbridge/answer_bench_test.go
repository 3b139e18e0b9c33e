package mcpbridge_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/mcpwire"
)

// bigBalance is a tool server whose every call is answered with a
// GetBalanceResponse naming a customer of size bytes, which the answer
// carries twice (its text and its structuredContent).
type bigBalance struct{ id string }

func (b bigBalance) Invoke(_ context.Context, _ string, _, reply any, _ ...grpc.CallOption) error {
	out := reply.(proto.Message).ProtoReflect()
	fields := out.Descriptor().Fields()
	out.Set(fields.ByName("customer_id"), protoreflect.ValueOfString(b.id))
	out.Set(fields.ByName("charged_cents"), protoreflect.ValueOfInt64(1<<40))
	return nil
}

func (bigBalance) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	panic("no streams")
}

// discard is a ResponseWriter that counts what it is written.
type discard struct {
	h http.Header
	n int
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { d.n += len(p); return len(p), nil }
func (d *discard) WriteHeader(int)             {}
func (d *discard) Flush()                      {}

// BenchmarkLargeAnswer is what one tools/call with a large answer costs
// the bridge over stateless HTTP, from the gRPC response to the SSE bytes
// written: B/op over the answer's size (B/answer-byte) is how many times
// the answer is copied.
func BenchmarkLargeAnswer(b *testing.B) {
	const size = 1 << 20
	files, err := mcpbridge.NewFiles(mcpbridge.FileSet(paymentsv1.File_examples_payments_v1_payments_proto).GetFile())
	if err != nil {
		b.Fatal(err)
	}
	server, err := mcpbridge.New(mcpbridge.Config{Conn: bigBalance{id: strings.Repeat("x", size)}, Files: files})
	if err != nil {
		b.Fatal(err)
	}
	h := mcpbridge.HTTPHandler(server, mcpwire.HTTPLimits{})
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"examples.payments.v1.PaymentsService.GetBalance","arguments":{"customerId":"c"}}}`)
	call := func() int {
		r, _ := http.NewRequest(http.MethodPost, "/mcp", bytes.NewReader(body))
		r.RemoteAddr = "127.0.0.1:1234"
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		r.Header.Set("MCP-Protocol-Version", "2025-06-18")
		w := &discard{h: http.Header{}}
		h.ServeHTTP(w, r)
		return w.n
	}
	if n := call(); n < 2*size {
		b.Fatalf("the answer is %d bytes, want at least %d", n, 2*size)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var n int
	for b.Loop() {
		n = call()
	}
	b.StopTimer()
	b.ReportMetric(float64(n), "answer-bytes")
}

package mcpgate_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/mcpgate"
)

// A tool result holding a map of 64 entries, and text the tool wrote in
// Go's random map order, reaches its first caller and every duplicate in the
// same bytes but for the replay mark: the gate encodes the result once
// (encoding/json sorts map keys) and answers the first call with the bytes
// it stores, not a second encoding.
func TestFirstAnswerAndReplaysOfAMapAreByteIdentical(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	server := mcp.NewServer(&mcp.Implementation{Name: "maps-test", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "tag", Description: "tags a thing"},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, map[string]string, error) {
			n := runs.Add(1)
			tags := make(map[string]string, 64)
			for i := range 64 {
				tags[fmt.Sprintf("k%02d", i)] = fmt.Sprintf("value %d of run %d", i, n)
			}
			var text strings.Builder
			for k, v := range tags { // Go's random order, as the tool wrote it
				fmt.Fprintf(&text, "%s=%s;", k, v)
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text.String()}}}, tags, nil
		})
	gate, err := mcpgate.New(context.Background(), embeddedDedupe(t), server, mcpgate.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	ct, st := mcp.NewInMemoryTransports()
	ss, err := server.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	wire := &syncBuffer{}
	client := connect(t, &mcp.LoggingTransport{Transport: ct, Writer: wire})

	for i := range 6 {
		if res := call(t, client, "tag", "tag-1", nil); res.IsError || replayed(res) != (i > 0) {
			t.Fatalf("call %d: error %v, replayed %v", i+1, res.IsError, replayed(res))
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the tool ran %d times, want once", n)
	}
	results := wire.results(t)
	first := string(results[len(results)-6])
	if !strings.Contains(first, `"io.idemgate/replayed":false`) {
		t.Fatalf("the first answer carries no mark: %s", first)
	}
	want := strings.Replace(first, `"io.idemgate/replayed":false`, `"io.idemgate/replayed":true`, 1)
	for i, raw := range results[len(results)-5:] {
		if string(raw) != want {
			t.Fatalf("duplicate %d's replay differs from the first answer beyond the mark:\n%s\n%s", i+1, raw, first)
		}
	}
}

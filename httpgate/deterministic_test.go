package httpgate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/httpgate"
)

// A response holding a map of 64 entries, as JSON and as text the handler
// wrote in Go's random map order, reaches its first caller and every
// duplicate in the same bytes: the gate answers the first call with the
// body it recorded and stores, and replays that body, never a second
// encoding.
func TestFirstAnswerAndReplaysOfAMapAreByteIdentical(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	gate, err := httpgate.New(dedupe(t), "maps-test", httpgate.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gate.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := runs.Add(1)
		tags := make(map[string]string, 64)
		for i := range 64 {
			tags[fmt.Sprintf("k%02d", i)] = fmt.Sprintf("value %d of run %d", i, n)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(tags)
		for k, v := range tags { // Go's random order, as the handler wrote it
			fmt.Fprintf(w, "%s=%s;", k, v)
		}
	})))
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	first := post(t, srv.URL+"/tags", `"tags-1"`, `{}`)
	if first.status != http.StatusCreated || first.header.Get(httpgate.ReplayedHeader) != "" {
		t.Fatalf("first answer: %d %v", first.status, first.header)
	}
	for i := range 5 {
		again := post(t, srv.URL+"/tags", `"tags-1"`, `{}`)
		if again.header.Get(httpgate.ReplayedHeader) != "true" {
			t.Fatalf("duplicate %d was not a replay: %d %v", i+1, again.status, again.header)
		}
		if again.status != first.status || !bytes.Equal(again.body, first.body) {
			t.Fatalf("duplicate %d's replay differs from the first answer:\n%s\n%s", i+1, again.body, first.body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once", n)
	}
}

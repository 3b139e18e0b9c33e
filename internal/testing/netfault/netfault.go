package netfault

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Proxy is a TCP proxy from a free loopback port to one upstream address,
// with at most one fault at a time. Its methods are safe for concurrent use.
type Proxy struct {
	tb    testing.TB
	proxy *toxiproxy.Proxy

	mu sync.Mutex
	// lossy is set while a fault that drops bytes is on, or was since the
	// connections were last cut: Heal and the next fault cut them then.
	lossy bool
}

// NewProxy starts a proxy on a free loopback port that forwards every
// connection to upstream (host:port), without faults. It dials upstream only
// when a client connects, so upstream need not listen yet. The proxy and its
// connections are closed when the test ends.
func NewProxy(tb testing.TB, upstream string) *Proxy {
	tb.Helper()
	// toxiproxy's metrics stay off (no collectors) and its logging is
	// discarded: it logs every connection.
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	tp := toxiproxy.NewProxy(server, tb.Name(), "127.0.0.1:0", upstream)
	if err := tp.Start(); err != nil {
		tb.Fatalf("netfault: start proxy to %s: %v", upstream, err)
	}
	tb.Cleanup(tp.Stop)
	return &Proxy{tb: tb, proxy: tp}
}

// Addr returns the proxy's loopback address (host:port) for clients to dial;
// it stays the same for the proxy's life, across Cut and Heal.
func (p *Proxy) Addr() string {
	p.proxy.Lock()
	defer p.proxy.Unlock()
	return p.proxy.Listen
}

// Latency delays every reply chunk (server to client) by d; requests pass at
// once, and nothing is lost. Delaying replies rather than requests is the case
// that matters to idempotency: the server has done the work when a client
// whose deadline is shorter than d gives up.
func (p *Proxy) Latency(d time.Duration) {
	p.tb.Helper()
	p.set(false, toxic{Type: "latency", Stream: "downstream", Attributes: map[string]any{"latency": d.Milliseconds()}})
}

// Blackhole keeps accepting connections but forwards nothing in either
// direction and closes nothing, until Heal: a partition, or a peer that
// stopped answering. Calls through the proxy run into their deadlines.
func (p *Proxy) Blackhole() {
	p.tb.Helper()
	p.set(true,
		toxic{Type: "timeout", Stream: "upstream", Attributes: map[string]any{"timeout": 0}},
		toxic{Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": 0}})
}

// Timeout is Blackhole that closes each connection d after the fault starts
// (for connections open then) or after the connection is accepted: a peer that
// hangs, then drops the connection. d must be positive.
func (p *Proxy) Timeout(d time.Duration) {
	p.tb.Helper()
	if d <= 0 {
		p.tb.Fatalf("netfault: Timeout(%v): want a positive duration (Blackhole never closes)", d)
	}
	ms := max(d.Milliseconds(), 1)
	p.set(true,
		toxic{Type: "timeout", Stream: "upstream", Attributes: map[string]any{"timeout": ms}},
		toxic{Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": ms}})
}

// Reset closes each connection as soon as data arrives on it in either
// direction, so calls fail with UNAVAILABLE; a connection accepted while the
// fault is on gets a reset (RST), an older one a FIN. Idle connections stay
// open until they carry data; Cut closes them at once.
func (p *Proxy) Reset() {
	p.tb.Helper()
	p.set(true,
		toxic{Type: "reset_peer", Stream: "upstream", Attributes: map[string]any{"timeout": 0}},
		toxic{Type: "reset_peer", Stream: "downstream", Attributes: map[string]any{"timeout": 0}})
}

// DropReplies forwards requests (client to server) but drops everything the
// server sends back: the server does the work, the client never learns of it
// and its calls run into their deadlines.
func (p *Proxy) DropReplies() {
	p.tb.Helper()
	p.set(true, toxic{Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": 0}})
}

// Heal removes the fault. If a fault that drops bytes was on since the last
// Heal, it also cuts the open connections, whose byte streams now have gaps;
// clients reconnect, and a call that races the cut fails with UNAVAILABLE, as
// on any dropped connection. After Latency alone, connections stay open.
func (p *Proxy) Heal() {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.proxy.Toxics.ResetToxics(context.Background())
	if p.lossy {
		p.cut()
		p.lossy = false
	}
}

// Cut closes every connection open through the proxy, with the fault left as
// it is; clients see their connections drop and reconnect. The proxy stops
// listening for a moment meanwhile, so a dial then is refused.
func (p *Proxy) Cut() {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut()
	p.lossy = false
}

// cut restarts the proxy on the same address: toxiproxy closes every
// connection when it stops, and offers no other way to close them.
func (p *Proxy) cut() {
	p.tb.Helper()
	p.proxy.Stop()
	// Start listens on Listen, which holds the concrete port since the first
	// start. Nothing else binds loopback ports between the two calls in
	// practice, but a retry costs little.
	var err error
	for range 20 {
		if err = p.proxy.Start(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.tb.Fatalf("netfault: restart proxy on %s: %v", p.proxy.Listen, err)
}

// toxic is the JSON toxiproxy's toxic collection takes.
type toxic struct {
	Type       string         `json:"type"`
	Stream     string         `json:"stream"`
	Attributes map[string]any `json:"attributes"`
}

// set replaces the current fault with toxics; lossy says whether they drop
// bytes. Like Heal, it first cuts the connections a lossy fault touched.
func (p *Proxy) set(lossy bool, toxics ...toxic) {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.proxy.Toxics.ResetToxics(context.Background())
	if p.lossy {
		p.cut() // their byte streams have gaps: see Heal
	}
	p.lossy = lossy
	for _, t := range toxics {
		b, err := json.Marshal(t)
		if err != nil {
			p.tb.Fatalf("netfault: %v", err)
		}
		if _, err := p.proxy.Toxics.AddToxicJson(bytes.NewReader(b)); err != nil {
			p.tb.Fatalf("netfault: add %s toxic (%s): %v", t.Type, t.Stream, err)
		}
	}
}

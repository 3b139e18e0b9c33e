package dedupeapp

import (
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// fakeConn is a connection from addr that notes whether it was closed.
type fakeConn struct {
	net.Conn
	addr   *net.TCPAddr
	closed atomic.Bool
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.addr }
func (c *fakeConn) Close() error         { c.closed.Store(true); return nil }

// The unauthenticated connections a new one pushes over the caps are closed:
// past the per-IP cap its own address's oldest, past the total the oldest of
// the address holding the most, never a lone connection of another address,
// and never one that authenticated.
func TestPreauthEvictionOrder(t *testing.T) {
	g := newPreauthGate(nil, Config{MaxUnauthenticatedConnections: 4, MaxUnauthenticatedConnectionsPerIP: 3,
		MaxUnauthenticatedStreams: 1, UnauthenticatedTimeout: time.Hour})
	port := 1000
	open := func(ip string) *fakeConn {
		port++
		c := &fakeConn{addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: port}}
		g.admit(c)
		return c
	}
	tool := open("10.0.0.1")
	var strangers []*fakeConn
	for range 3 {
		strangers = append(strangers, open("10.0.0.9"))
	}
	if tool.closed.Load() || anyClosed(strangers) {
		t.Fatal("a connection under the caps was closed")
	}
	// A fourth from the stranger's address: past its cap of 3, its oldest goes.
	strangers = append(strangers, open("10.0.0.9"))
	if !strangers[0].closed.Load() || tool.closed.Load() {
		t.Fatalf("past the per-IP cap: stranger's oldest closed %v, tool server's closed %v; want the stranger's oldest only", strangers[0].closed.Load(), tool.closed.Load())
	}
	// Another address: past the total of 4, the address holding the most
	// (the stranger, 3) gives way, not the tool server's lone connection.
	other := open("10.0.0.2")
	if !strangers[1].closed.Load() || tool.closed.Load() || other.closed.Load() {
		t.Fatalf("past the total: closed stranger[1] %v, tool %v, other %v; want the stranger's oldest only",
			strangers[1].closed.Load(), tool.closed.Load(), other.closed.Load())
	}
	// An authenticated connection counts no more.
	g.mu.Lock()
	g.conns[tool.addr.String()].authenticated = true
	g.dropLocked(g.conns[tool.addr.String()])
	n := g.nUnauth
	g.mu.Unlock()
	if n != 3 {
		t.Fatalf("%d unauthenticated connections counted, want 3", n)
	}
	for i := range 6 {
		open("10.0.1." + strconv.Itoa(i))
	}
	if tool.closed.Load() {
		t.Fatal("an authenticated connection was closed to make room")
	}
}

func anyClosed(cs []*fakeConn) bool {
	for _, c := range cs {
		if c.closed.Load() {
			return true
		}
	}
	return false
}

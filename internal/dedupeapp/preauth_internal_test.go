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

// The per-IP cap counts an IPv6 client by its /64, which one client owns
// whole (and can rotate addresses in), and an IPv4 client, also when it
// comes IPv4-mapped, by its address.
func TestPreauthGroupsIPv6ByItsSlash64(t *testing.T) {
	for _, tc := range []struct{ addr, group string }{
		{"192.0.2.1", "192.0.2.1"},
		{"192.0.2.2", "192.0.2.2"},
		{"::ffff:192.0.2.1", "192.0.2.1"},
		{"::1", "::/64"},
		{"2001:db8::1", "2001:db8::/64"},
		{"2001:db8::2", "2001:db8::/64"},
		{"2001:db8::ffff:ffff:ffff:ffff", "2001:db8::/64"},
		{"2001:db8:0:1::1", "2001:db8:0:1::/64"},
	} {
		if got := ipGroup(&net.TCPAddr{IP: net.ParseIP(tc.addr), Port: 4242}); got != tc.group {
			t.Errorf("TCP address %s counts as %q, want %q", tc.addr, got, tc.group)
		}
		// An address that is not a *net.TCPAddr is parsed from its string.
		if got := ipGroup(stringAddr(net.JoinHostPort(tc.addr, "4242"))); got != tc.group {
			t.Errorf("address %s counts as %q, want %q", tc.addr, got, tc.group)
		}
	}
}

// stringAddr is a net.Addr that is only its string.
type stringAddr string

func (a stringAddr) Network() string { return "tcp" }
func (a stringAddr) String() string  { return string(a) }

// Through admit: connections from addresses of one IPv6 /64 share the
// per-IP cap, so rotating addresses closes the /64's own oldest, not a
// connection of the next /64 nor of an IPv4 client.
func TestPreauthCapsAnIPv6Slash64AsOneAddress(t *testing.T) {
	g := newPreauthGate(nil, Config{MaxUnauthenticatedConnections: 100, MaxUnauthenticatedConnectionsPerIP: 2,
		MaxUnauthenticatedStreams: 1, UnauthenticatedTimeout: time.Hour})
	open := func(ip string) *fakeConn {
		c := &fakeConn{addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 4242}}
		g.admit(c)
		return c
	}
	neighbour := open("2001:db8:0:1::1")
	v4 := open("192.0.2.1")
	var rotating []*fakeConn
	for i := range 3 {
		rotating = append(rotating, open("2001:db8::"+strconv.Itoa(i+1)))
	}
	if !rotating[0].closed.Load() || rotating[1].closed.Load() || rotating[2].closed.Load() {
		t.Fatalf("three connections from three addresses of one /64 under a cap of 2: closed %v %v %v; want the oldest only",
			rotating[0].closed.Load(), rotating[1].closed.Load(), rotating[2].closed.Load())
	}
	// The mapped form of the IPv4 client's address is the same client.
	mapped := open("::ffff:192.0.2.1")
	open("::ffff:192.0.2.1")
	if !v4.closed.Load() || mapped.closed.Load() {
		t.Fatalf("an IPv4 client over its cap, partly IPv4-mapped: closed oldest %v, next %v; want the oldest only", v4.closed.Load(), mapped.closed.Load())
	}
	if neighbour.closed.Load() {
		t.Fatal("the connection of another /64 was closed")
	}
}

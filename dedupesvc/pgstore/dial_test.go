package pgstore_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc/pgstore"
)

// addrConn is a net.Conn with the addresses a test gives it.
type addrConn struct {
	net.Conn
	local, remote net.Addr
	closed        bool
}

func (c *addrConn) LocalAddr() net.Addr  { return c.local }
func (c *addrConn) RemoteAddr() net.Addr { return c.remote }
func (c *addrConn) Close() error         { c.closed = true; return c.Conn.Close() }

// TestRejectSelfConnects: a dial whose connection's local address is its
// remote one fails, as the database unreachable, and its connection is
// closed; any other connection is returned as dialled.
func TestRejectSelfConnects(t *testing.T) {
	t.Parallel()
	at := func(port int) *net.TCPAddr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port} }
	for _, tt := range []struct {
		name          string
		local, remote net.Addr
		rejected      bool
	}{
		{"itself", at(5432), at(5432), true},
		{"itself over IPv6", &net.TCPAddr{IP: net.IPv6loopback, Port: 5432}, &net.TCPAddr{IP: net.IPv6loopback, Port: 5432}, true},
		{"another port", at(40000), at(5432), false},
		{"another address", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 5432}, at(5432), false},
		{"not TCP", &net.UnixAddr{Name: "/tmp/.s.PGSQL.5432", Net: "unix"}, &net.UnixAddr{Name: "/tmp/.s.PGSQL.5432", Net: "unix"}, false},
	} {
		client, server := net.Pipe()
		conn := &addrConn{Conn: client, local: tt.local, remote: tt.remote}
		dial := pgstore.RejectSelfConnects(func(context.Context, string, string) (net.Conn, error) { return conn, nil })
		got, err := dial(ctx, "tcp", "127.0.0.1:5432")
		if tt.rejected {
			if got != nil || !errors.Is(err, pgstore.ErrSelfConnect) || !pgstore.UnreachableForTest(ctx, err) || !conn.closed {
				t.Errorf("%s: dial = %v, %v (closed: %v); want ErrSelfConnect, unreachable, the connection closed", tt.name, got, err, conn.closed)
			}
		} else if got != conn || err != nil || conn.closed {
			t.Errorf("%s: dial = %v, %v (closed: %v); want the connection", tt.name, got, err, conn.closed)
		}
		client.Close()
		server.Close()
	}
}

// TestASelfConnectLeavesThePortFree connects a real socket to itself (bound
// to the port it dials, where nothing listens: the simultaneous open the
// kernel makes of a dial that picked the target port as its source) and
// checks RejectSelfConnects frees the port at once, for the database to
// listen on.
func TestASelfConnectLeavesThePortFree(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("a socket dialling its own address connects to itself on Linux")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().(*net.TCPAddr)
	lis.Close()
	dialer := &net.Dialer{LocalAddr: addr}
	conn, err := pgstore.RejectSelfConnects(dialer.DialContext)(ctx, "tcp", net.JoinHostPort(addr.IP.String(), strconv.Itoa(addr.Port)))
	if err == nil {
		conn.Close()
		t.Fatalf("a dial that connected to itself (%v to %v) succeeded", conn.LocalAddr(), conn.RemoteAddr())
	}
	if !errors.Is(err, pgstore.ErrSelfConnect) {
		t.Skipf("the dial did not connect to itself: %v", err)
	}
	again, err := net.Listen("tcp", addr.String())
	if err != nil {
		t.Fatalf("listening on the port of a rejected self-connect: %v, want it free", err)
	}
	again.Close()
}

package pgstore

import (
	"context"
	"errors"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrSelfConnect is the error of a dial that RejectSelfConnects refused
// because the connection reached itself.
var ErrSelfConnect = errors.New("the connection reached itself (its local address is the remote one): nothing listens there")

// RejectSelfConnects wraps dial (net.Dialer's DialContext when nil) for
// pgconn.Config.DialFunc: a TCP connection whose local address is its
// remote one is reset at once and the dial fails with an *net.OpError
// wrapping ErrSelfConnect, which the store counts as the database being
// unreachable. On loopback, while nothing listens on the database's port,
// the kernel may pick that very port as a dial's source, and TCP's
// simultaneous open then connects the socket to itself; such a connection
// holds the port, so the database restarted could not bind it for as long
// as the connection lasted (minutes, seen).
func RejectSelfConnects(dial pgconn.DialFunc) pgconn.DialFunc {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil || !selfConnected(conn) {
			return conn, err
		}
		remote := conn.RemoteAddr()
		// Reset, not closed: a close would leave the socket in TIME_WAIT,
		// still holding the port against the database's bind for a minute.
		if l, ok := conn.(interface{ SetLinger(sec int) error }); ok {
			_ = l.SetLinger(0)
		}
		conn.Close()
		return nil, &net.OpError{Op: "dial", Net: network, Source: remote, Addr: remote, Err: ErrSelfConnect}
	}
}

// selfConnected reports whether conn is a TCP connection to itself.
func selfConnected(conn net.Conn) bool {
	local, ok := conn.LocalAddr().(*net.TCPAddr)
	if !ok {
		return false
	}
	remote, ok := conn.RemoteAddr().(*net.TCPAddr)
	return ok && local.Port == remote.Port && local.IP.Equal(remote.IP) && local.Zone == remote.Zone
}

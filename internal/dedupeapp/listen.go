package dedupeapp

import (
	"context"
	"errors"
	"net"
	"syscall"
)

// errProbed ends a probe's listen once its socket is bound, before it
// listens.
var errProbed = errors.New("dedupeapp: bound without listening")

// checkListen reports what net.Listen("tcp", addr) would refuse now (an
// address another socket listens on, a host that is not this machine's)
// without listening: a socket that listens, even for an instant, completes
// the handshakes a TCP readiness check counts. It binds a socket and closes
// it, as a listen with SO_REUSEADDR would bind. Where a socket cannot be
// bound alone (not unix) it checks nothing: the listen itself is the
// check.
func checkListen(ctx context.Context, addr string) error {
	if !canBindAlone {
		return nil
	}
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var bindErr error
		if err := c.Control(func(fd uintptr) { bindErr = bindAlone(fd, network, address) }); err != nil {
			return err
		}
		if bindErr != nil {
			return bindErr
		}
		return errProbed
	}}
	lis, err := lc.Listen(ctx, "tcp", addr)
	if lis != nil { // not reached: Control ends every listen
		_ = lis.Close()
	}
	if errors.Is(err, errProbed) {
		return nil
	}
	return err
}

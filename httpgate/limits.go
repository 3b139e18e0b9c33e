package httpgate

import (
	"flag"
	"net"
	"net/http"
	"time"

	"github.com/idemgate/idemgate/internal/httplimits"
)

// ServerLimits bounds what the clients of the HTTP server a gate is mounted
// on can cost it: the time a slow, idle or never-reading connection holds
// its descriptor, and the connections held at once, in total and per client
// address, so one client cannot lock the others out. Serve with both halves:
//
//	limits := httpgate.ServerLimits{} // the defaults
//	srv := limits.Server(gate.Handler(mux))
//	err := srv.Serve(limits.Listener(lis))
//
// The same limits serve a connectgate or mcpgate handler. The zero value of
// a field takes its default; a negative one is taken as its default too.
type ServerLimits struct {
	// ReadHeaderTimeout bounds the reading of a request's headers.
	// Defaults to 10s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds the reading of a whole request, body included (over
	// HTTP/2, each stream's): a body trickled slower is cut. Defaults to
	// 30s.
	ReadTimeout time.Duration
	// WriteTimeout bounds each write of a response once the handler starts
	// writing it, and the final flush: a client that reads nothing for this
	// long is dropped and its response's memory freed. The handler's time
	// before it writes is not counted, so a gated call may take its
	// execution timeout (http.Server's own WriteTimeout would count it).
	// Defaults to 30s.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle this long. Defaults
	// to 2m.
	IdleTimeout time.Duration
	// MaxConnections bounds the connections held at once: one past it
	// closes the oldest idle keep-alive connection of the client holding the
	// most, else the connection reading a request body slowest when it
	// reads under 240 bytes a second counted from 5s after it began (a
	// trickle), or waits until a connection closes, idles or turns that
	// slow. Defaults to 512.
	MaxConnections int
	// MaxConnectionsPerIP bounds one client address's connections (an IPv6
	// client's /64): one past it closes that client's oldest idle
	// keep-alive connection, or is closed itself when none is idle.
	// Defaults to 64, or MaxConnections when that is less.
	MaxConnectionsPerIP int
}

func (l ServerLimits) internal() httplimits.Limits {
	in := httplimits.Limits(l)
	for _, d := range []*time.Duration{&in.ReadHeaderTimeout, &in.ReadTimeout, &in.WriteTimeout, &in.IdleTimeout} {
		*d = max(*d, 0)
	}
	in.MaxConnections, in.MaxConnectionsPerIP = max(in.MaxConnections, 0), max(in.MaxConnectionsPerIP, 0)
	return in.WithDefaults()
}

// Server returns an http.Server serving h with l's timeouts, and a
// ConnState hook that tells l.Listener's connections which are idle (leave
// it set). Set its Protocols, TLSConfig and the like as needed.
func (l ServerLimits) Server(h http.Handler) *http.Server { return l.internal().Server(h) }

// Listener returns lis within l's connection caps. Serve it with a Server
// of l's, which tells it the idle connections it may close first.
func (l ServerLimits) Listener(lis net.Listener) net.Listener { return l.internal().Listener(lis) }

// RegisterFlags defines on fs the flags that set l, with its defaults:
// -read-header-timeout, -read-timeout, -write-timeout, -idle-timeout,
// -max-connections and -max-connections-per-ip, as every binary of this
// project names them.
func (l *ServerLimits) RegisterFlags(fs *flag.FlagSet) { (*httplimits.Limits)(l).RegisterFlags(fs) }

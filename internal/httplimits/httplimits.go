// Package httplimits bounds what the clients of an HTTP listener can cost
// it: the time a slow or idle connection holds its descriptor (read-header,
// read, write and idle timeouts) and the connections held at once, in total
// and per client address (an IPv6 client by its /64), so one client cannot
// lock the others out. Every HTTP listener the project ships uses it;
// httpgate.ServerLimits exposes it to library users.
package httplimits

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Limits bounds an HTTP server's connections. The zero value of a field
// takes its default.
type Limits struct {
	// ReadHeaderTimeout bounds the reading of a request's headers.
	// Defaults to DefaultReadHeaderTimeout.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds the reading of a whole request, body included (over
	// HTTP/2, each stream's): a body trickled slower is cut. Defaults to
	// DefaultReadTimeout.
	ReadTimeout time.Duration
	// WriteTimeout bounds each write of a response once the handler starts
	// writing it (and the final flush after the handler returns): a client
	// that reads nothing for this long is dropped and the response's memory
	// freed. A handler's own time before it writes is not counted, so a
	// gated call may take its execution timeout. Defaults to
	// DefaultWriteTimeout.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle this long. Defaults
	// to DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxConnections bounds the connections held at once. A connection past
	// it closes the oldest idle keep-alive connection of the client holding
	// the most; when none is idle, the connection reading a request body
	// slowest, under 240 bytes a second counted from 5s after it began (a
	// trickle); when none is that slow it waits to be served until one
	// closes, idles or turns slow. Defaults to DefaultMaxConnections.
	MaxConnections int
	// MaxConnectionsPerIP bounds the connections of one client address (an
	// IPv6 one's /64) at once. A connection past it closes that client's
	// oldest idle keep-alive connection; when none is idle, the new
	// connection is closed. Defaults to DefaultMaxConnectionsPerIP; at most
	// MaxConnections.
	MaxConnectionsPerIP int
}

// The Limits defaults.
const (
	// DefaultReadHeaderTimeout is 10s.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultReadTimeout is 30s: a 4 MiB body at 140 KB/s.
	DefaultReadTimeout = 30 * time.Second
	// DefaultWriteTimeout is 30s.
	DefaultWriteTimeout = 30 * time.Second
	// DefaultIdleTimeout is 2m.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultMaxConnections is 512, as the Dedupe service's -max-connections.
	DefaultMaxConnections = 512
	// DefaultMaxConnectionsPerIP is 64: an eighth of DefaultMaxConnections.
	DefaultMaxConnectionsPerIP = 64
)

// WithDefaults returns l with the default of every zero field.
func (l Limits) WithDefaults() Limits {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&l.ReadTimeout, DefaultReadTimeout)
	def(&l.WriteTimeout, DefaultWriteTimeout)
	def(&l.IdleTimeout, DefaultIdleTimeout)
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.MaxConnectionsPerIP == 0 {
		l.MaxConnectionsPerIP = DefaultMaxConnectionsPerIP
	}
	// One client may hold them all, no more.
	l.MaxConnectionsPerIP = min(l.MaxConnectionsPerIP, l.MaxConnections)
	return l
}

// Check refuses a negative limit, naming it by the flag that sets it
// (prefix and the flag's name, such as "-read-timeout").
func (l Limits) Check(prefix string) error {
	switch {
	case l.ReadHeaderTimeout < 0:
		return fmt.Errorf("%sread-header-timeout must be positive, got %s", prefix, l.ReadHeaderTimeout)
	case l.ReadTimeout < 0:
		return fmt.Errorf("%sread-timeout must be positive, got %s", prefix, l.ReadTimeout)
	case l.WriteTimeout < 0:
		return fmt.Errorf("%swrite-timeout must be positive, got %s", prefix, l.WriteTimeout)
	case l.IdleTimeout < 0:
		return fmt.Errorf("%sidle-timeout must be positive, got %s", prefix, l.IdleTimeout)
	case l.MaxConnections < 0:
		return fmt.Errorf("%smax-connections must be positive, got %d", prefix, l.MaxConnections)
	case l.MaxConnectionsPerIP < 0:
		return fmt.Errorf("%smax-connections-per-ip must be positive, got %d", prefix, l.MaxConnectionsPerIP)
	}
	return nil
}

// Server returns an http.Server serving h with l's timeouts, h wrapped so
// that each write of a response has l.WriteTimeout (http.Server's own
// WriteTimeout would count the handler's time too), each request body's
// reading counted against its connection, and the requests a client
// cancelled before they arrived counted too (a connection past
// MaxResetsPerSecond is closed),
// and ConnState and ConnContext hooks that tell l.Listener's connections
// which are idle and which read their bodies slowly (evicted when the
// listener is full). Set
// its Protocols, TLSConfig and the like as needed, but not ConnState nor
// ConnContext.
func (l Limits) Server(h http.Handler) *http.Server {
	l = l.WithDefaults()
	return &http.Server{
		Handler:           perRequest(writeDeadlines(h, l.WriteTimeout)),
		ConnContext:       connContext,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		IdleTimeout:       l.IdleTimeout,
		ConnState:         connState,
	}
}

// Listener returns lis holding at most l.MaxConnections connections at
// once, and at most l.MaxConnectionsPerIP of one client address; see
// those fields. Idle connections are known only to a Server of l's that
// serves the listener.
func (l Limits) Listener(lis net.Listener) net.Listener {
	l = l.WithDefaults()
	return newListener(lis, l.MaxConnections, l.MaxConnectionsPerIP)
}

// writeDeadlines gives each write of a response (and the flush after the
// handler) a write deadline d from its start.
func writeDeadlines(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: d}
		h.ServeHTTP(dw, r)
		// net/http writes what is buffered, and the end of the response,
		// after the handler returns.
		dw.extend()
	})
}

// deadlineWriter sets the write deadline before each write.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *deadlineWriter) extend() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.d)) }

// Write implements http.ResponseWriter.
func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.extend()
	return w.ResponseWriter.Write(p)
}

// Flush implements http.Flusher.
func (w *deadlineWriter) Flush() {
	w.extend()
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// RegisterFlags defines on fs the flags that set l, with the defaults:
// -read-header-timeout, -read-timeout, -write-timeout, -idle-timeout,
// -max-connections and -max-connections-per-ip, the same in every binary.
func (l *Limits) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&l.ReadHeaderTimeout, "read-header-timeout", DefaultReadHeaderTimeout, "bound on reading an HTTP request's headers")
	fs.DurationVar(&l.ReadTimeout, "read-timeout", DefaultReadTimeout, "bound on reading a whole HTTP request, body included; a slower one is cut")
	fs.DurationVar(&l.WriteTimeout, "write-timeout", DefaultWriteTimeout, "bound on each write of an HTTP response once it starts: a client that reads nothing this long is dropped (the handler's time before it answers is not counted)")
	fs.DurationVar(&l.IdleTimeout, "idle-timeout", DefaultIdleTimeout, "close an HTTP keep-alive connection idle this long")
	fs.IntVar(&l.MaxConnections, "max-connections", DefaultMaxConnections, "HTTP connections held at once; past it the oldest idle connection of the client holding the most is closed, else the one reading a request body slowest (under 240 bytes a second after 5s), or the new one waits")
	fs.IntVar(&l.MaxConnectionsPerIP, "max-connections-per-ip", DefaultMaxConnectionsPerIP, "HTTP connections of one client address (IPv6: its /64) at once; past it that client's oldest idle connection is closed, or the new one")
}

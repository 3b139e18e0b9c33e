package httplimits

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// A connection reading a request body slower than minBodyRate bytes a
// second, counted from bodyRateGrace after it began, gives its slot to a
// new connection when the listener is full and none is idle: Kestrel's
// MinRequestBodyDataRate (240 bytes a second after 5 s), applied only under
// pressure, so a slow link is cut only when another client needs the slot.
// Only a body being read counts: a handler's time after its body (the call
// running) never does.
const (
	minBodyRate   = 240
	bodyRateGrace = 5 * time.Second
	// pressureRecheck is how often an Accept waiting for a slot looks
	// again for a slow reader to evict: a reader turns slow as time passes,
	// which wakes nothing.
	pressureRecheck = time.Second
)

// listener caps the connections it holds, in total and per IPGroup.
type listener struct {
	net.Listener
	max, perIP int

	mu sync.Mutex
	// byIP are each client's open connections, oldest first.
	byIP map[string][]*conn
	n    int
	// freed is closed and replaced when a connection closes or turns idle,
	// waking an Accept waiting for a slot.
	freed chan struct{}
	// done is closed by Close, ending a wait for a slot.
	done      chan struct{}
	closeOnce sync.Once
}

func newListener(lis net.Listener, max, perIP int) *listener {
	return &listener{Listener: lis, max: max, perIP: perIP, byIP: map[string][]*conn{}, freed: make(chan struct{}), done: make(chan struct{})}
}

// Close implements net.Listener; an Accept waiting for a slot returns.
func (l *listener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// conn is a connection the listener holds.
type conn struct {
	net.Conn
	l  *listener
	ip string
	// idle is under l.mu: the server reports it between requests.
	idle bool
	// readers is how many of the connection's requests are reading their
	// bodies (HTTP/2: streams), readingSince when the first of them began,
	// both under l.mu; bodyBytes what they read since then.
	readers      int
	readingSince time.Time
	bodyBytes    atomic.Int64
	// resets counts the requests the client cancelled since resetsSince
	// (a window of a second), under l.mu.
	resets      int
	resetsSince time.Time
	closeOnce   sync.Once
	closeErr    error
}

// slowness is how far c's body reading falls short of minBodyRate at now:
// above 0 when it is slow, 0 when it reads nothing or is within the
// grace or the rate. Under l.mu.
func (c *conn) slowness(now time.Time) float64 {
	if c.readers == 0 {
		return 0
	}
	elapsed := now.Sub(c.readingSince)
	if elapsed < bodyRateGrace {
		return 0
	}
	owed := minBodyRate * (elapsed - bodyRateGrace).Seconds()
	return max(owed-float64(c.bodyBytes.Load()), 0)
}

// startReading marks a request of c reading its body.
func (c *conn) startReading() {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if c.readers == 0 {
		c.readingSince = time.Now()
		c.bodyBytes.Store(0)
	}
	c.readers++
}

// stopReading marks a request of c done with its body.
func (c *conn) stopReading() {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	c.readers--
}

// Close implements net.Conn: the listener forgets the connection.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		c.l.forget(c)
		c.closeErr = c.Conn.Close()
	})
	return c.closeErr
}

// Accept accepts the next connection within the caps: one past its
// client's share closes that client's oldest idle connection, or is closed
// itself when none is idle; one past the total closes the oldest idle
// connection of the client holding the most, or waits for a slot.
func (l *listener) Accept() (net.Conn, error) {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c, err := l.admit(raw)
		if err != nil {
			return nil, err
		}
		if c != nil {
			return c, nil
		}
	}
}

// admit returns raw tracked, or nil when it was refused (closed), or
// net.ErrClosed when the listener closed while it waited for a slot.
func (l *listener) admit(raw net.Conn) (*conn, error) {
	c := &conn{Conn: raw, l: l, ip: IPGroup(raw.RemoteAddr())}
	l.mu.Lock()
	for {
		var evict *conn
		switch {
		case len(l.byIP[c.ip]) >= l.perIP:
			if evict = oldestIdle(l.byIP[c.ip]); evict == nil {
				l.mu.Unlock()
				_ = raw.Close()
				return nil, nil
			}
		case l.n >= l.max:
			// The client holding the most gives way.
			for _, list := range l.byIP {
				if o := oldestIdle(list); o != nil && (evict == nil || len(list) > len(l.byIP[evict.ip])) {
					evict = o
				}
			}
			if evict == nil {
				evict = l.slowestReaderLocked(time.Now())
			}
			if evict == nil {
				// Every connection is busy: wait for one to close or idle,
				// or for a reader to turn slow.
				freed := l.freed
				l.mu.Unlock()
				recheck := time.NewTimer(pressureRecheck)
				select {
				case <-freed:
				case <-recheck.C:
				case <-l.done:
					recheck.Stop()
					_ = raw.Close()
					return nil, net.ErrClosed
				}
				recheck.Stop()
				l.mu.Lock()
				continue
			}
		}
		if evict != nil {
			l.dropLocked(evict)
			l.mu.Unlock()
			_ = evict.Close()
			l.mu.Lock()
			continue
		}
		l.byIP[c.ip] = append(l.byIP[c.ip], c)
		l.n++
		l.mu.Unlock()
		return c, nil
	}
}

// slowestReaderLocked returns the connection whose body reading falls
// furthest short of minBodyRate, nil when none does.
func (l *listener) slowestReaderLocked(now time.Time) *conn {
	var slowest *conn
	worst := 0.0
	for _, list := range l.byIP {
		for _, c := range list {
			if s := c.slowness(now); s > worst {
				slowest, worst = c, s
			}
		}
	}
	return slowest
}

func oldestIdle(list []*conn) *conn {
	for _, c := range list {
		if c.idle {
			return c
		}
	}
	return nil
}

// dropLocked stops counting c, waking a waiting Accept.
func (l *listener) dropLocked(c *conn) {
	list := l.byIP[c.ip]
	for i, o := range list {
		if o == c {
			list = append(list[:i:i], list[i+1:]...)
			l.n--
			break
		}
	}
	if len(list) == 0 {
		delete(l.byIP, c.ip)
	} else {
		l.byIP[c.ip] = list
	}
	l.wakeLocked()
}

func (l *listener) wakeLocked() {
	close(l.freed)
	l.freed = make(chan struct{})
}

func (l *listener) forget(c *conn) {
	l.mu.Lock()
	l.dropLocked(c)
	l.mu.Unlock()
}

// connKey is the context key of the listener's connection a request came
// on (connContext).
type connKey struct{}

// connContext is the Server's ConnContext hook: it keeps the listener's
// connection in each request's context, for perRequest.
func connContext(ctx context.Context, nc net.Conn) context.Context {
	if c := listenerConn(nc); c != nil {
		return context.WithValue(ctx, connKey{}, c)
	}
	return ctx
}

// listenerConn is the listener's connection nc is or wraps (TLS), nil
// when it came from another listener.
func listenerConn(nc net.Conn) *conn {
	for {
		if c, ok := nc.(*conn); ok {
			return c
		}
		// A TLS connection wraps the listener's.
		u, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		nc = u.NetConn()
	}
}

// MaxResetsPerSecond is how many of one connection's requests may arrive
// already cancelled by the client (an HTTP/2 stream reset before its
// handler started) within a second before the connection is closed: a
// client resetting streams as fast as it opens them (rapid reset) makes
// the server take up and drop a request each time, and grpc-go's and
// net/http's own defences bound only how many run at once. A call its
// client gives up on while it runs is not counted, so a herd of callers'
// deadlines running out together on one connection does not close it.
const MaxResetsPerSecond = 100

// perRequest counts each request body's bytes against its connection as
// it is read, so that a full listener can tell the slow readers
// (slowestReaderLocked), and does not serve a request its client cancelled
// before it arrived, counting it against its connection (cancelled).
func perRequest(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := r.Context().Value(connKey{}).(*conn)
		if !ok {
			h.ServeHTTP(w, r)
			return
		}
		if r.Context().Err() != nil {
			c.cancelled()
			return
		}
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &watchedBody{ReadCloser: r.Body, c: c}
		}
		h.ServeHTTP(w, r)
	})
}

// cancelled counts a request of c its client cancelled, and closes c past
// MaxResetsPerSecond of them in a second.
func (c *conn) cancelled() {
	c.l.mu.Lock()
	now := time.Now()
	if now.Sub(c.resetsSince) > time.Second {
		c.resetsSince, c.resets = now, 0
	}
	c.resets++
	tooMany := c.resets > MaxResetsPerSecond
	c.l.mu.Unlock()
	if tooMany {
		_ = c.Close()
	}
}

// watchedBody is a request body whose reading its connection counts:
// from the first Read until it ends, fails or is closed. Read and Close
// may come from different goroutines (net/http closes the body after the
// handler).
type watchedBody struct {
	io.ReadCloser
	c                *conn
	mu               sync.Mutex
	started, stopped bool
}

// Read implements io.Reader.
func (b *watchedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if !b.started && !b.stopped {
		b.started = true
		b.c.startReading()
	}
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	b.c.bodyBytes.Add(int64(n))
	if err != nil {
		b.stop()
	}
	return n, err
}

// Close implements io.Closer.
func (b *watchedBody) Close() error {
	b.stop()
	return b.ReadCloser.Close()
}

func (b *watchedBody) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started && !b.stopped {
		b.c.stopReading()
	}
	b.stopped = true
}

// connState is the Server's ConnState hook: it marks the listener's
// connections idle between requests (HTTP/2: with no stream open).
func connState(nc net.Conn, state http.ConnState) {
	c := listenerConn(nc)
	if c == nil {
		return
	}
	c.l.mu.Lock()
	c.idle = state == http.StateIdle
	if c.idle {
		c.l.wakeLocked()
	}
	c.l.mu.Unlock()
}

// RemoteIPGroup is IPGroup of an http.Request's RemoteAddr ("ip:port").
func RemoteIPGroup(remoteAddr string) string { return IPGroup(remoteAddrString(remoteAddr)) }

// remoteAddrString is a net.Addr of a RemoteAddr's text.
type remoteAddrString string

func (a remoteAddrString) Network() string { return "tcp" }
func (a remoteAddrString) String() string  { return string(a) }

// IPGroup is what a per-IP cap counts addr's connections under: an IPv4
// address (also IPv4-mapped IPv6) as itself, and an IPv6 address by its /64
// ("2001:db8::/64"), since one IPv6 client is given a /64 at least and can
// rotate addresses in it. An address that is no IP (a Unix socket) counts
// as itself.
func IPGroup(addr net.Addr) string {
	var ip netip.Addr
	if tcp, ok := addr.(*net.TCPAddr); ok {
		ip, _ = netip.AddrFromSlice(tcp.IP)
		ip = ip.WithZone(tcp.Zone)
	} else if ap, err := netip.ParseAddrPort(addr.String()); err == nil {
		ip = ap.Addr()
	} else {
		return addr.String()
	}
	ip = ip.Unmap()
	if !ip.Is6() {
		return ip.String()
	}
	// A zone (link-local) names another link: keep it apart.
	prefix := netip.PrefixFrom(ip.WithZone(""), 64).Masked().String()
	if zone := ip.Zone(); zone != "" {
		return prefix + "%" + zone
	}
	return prefix
}

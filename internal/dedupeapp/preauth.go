package dedupeapp

import (
	"context"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/httplimits"
)

// What a caller holds before it authenticates. grpc-go reads a whole
// request message (up to the receive limit, about 1 MiB) before any
// interceptor runs, and a connection holds one of -max-connections slots
// from its accept on: without these bounds a stranger with no credentials
// could make the service buffer connections x streams x 1 MiB, or fill
// every connection slot with idle ones.
//
// preauthGate bounds both. Its tap handle (grpc.InTapHandle) runs on a
// stream's headers, before grpc-go creates the stream: a call without valid
// credentials is refused there (auth.Authenticator.Admit), except health
// checks, of which a connection that has not authenticated may hold
// maxStreams. Its listener tracks each connection: one becomes
// authenticated with its first authenticated call; until then it counts
// against maxConns (and maxPerIP for its address, an IPv6 one's /64:
// ipGroup), and a new connection
// past those closes the oldest unauthenticated one, of its own address
// first, else of the address holding the most, preferring in either one
// that made a call without credentials (victimLocked); and it is closed
// when it has not authenticated within timeout.
type preauthGate struct {
	authn      *auth.Authenticator
	maxConns   int
	maxPerIP   int
	maxStreams int
	timeout    time.Duration

	mu sync.Mutex
	// conns are the open connections by remote address, the peer address
	// grpc-go gives the tap handle.
	conns map[string]*gatedConn
	// unauth are the unauthenticated connections of each IP (IPv6: each
	// /64; ipGroup), oldest first.
	unauth  map[string][]*gatedConn
	nUnauth int

	closed  *prometheus.CounterVec
	refused prometheus.Counter
	open    prometheus.GaugeFunc
}

// Reasons a connection that did not authenticate is closed: the values of
// the reason label of
// idemgate_dedupe_unauthenticated_connections_closed_total.
const (
	closedEvicted = "evicted"
	closedTimeout = "timeout"
)

func newPreauthGate(authn *auth.Authenticator, cfg Config) *preauthGate {
	g := &preauthGate{authn: authn, maxConns: cfg.MaxUnauthenticatedConnections, maxPerIP: cfg.MaxUnauthenticatedConnectionsPerIP,
		maxStreams: cfg.MaxUnauthenticatedStreams, timeout: cfg.UnauthenticatedTimeout,
		conns: map[string]*gatedConn{}, unauth: map[string][]*gatedConn{},
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_dedupe_unauthenticated_connections_closed_total",
			Help: "Connections closed before they authenticated, by reason: evicted (past -max-unauthenticated-connections or its per-IP cap), timeout (-unauthenticated-timeout).",
		}, []string{"reason"}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemgate_dedupe_unauthenticated_streams_refused_total",
			Help: "Health checks refused on connections that had not authenticated, past -max-unauthenticated-streams.",
		}),
	}
	g.open = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idemgate_dedupe_unauthenticated_connections",
		Help: "Open connections that have not authenticated yet.",
	}, func() float64 {
		g.mu.Lock()
		defer g.mu.Unlock()
		return float64(g.nUnauth)
	})
	for _, reason := range []string{closedEvicted, closedTimeout} {
		g.closed.WithLabelValues(reason)
	}
	return g
}

// Describe implements prometheus.Collector.
func (g *preauthGate) Describe(ch chan<- *prometheus.Desc) {
	g.closed.Describe(ch)
	g.refused.Describe(ch)
	g.open.Describe(ch)
}

// Collect implements prometheus.Collector.
func (g *preauthGate) Collect(ch chan<- prometheus.Metric) {
	g.closed.Collect(ch)
	g.refused.Collect(ch)
	g.open.Collect(ch)
}

// gatedConn is a connection the gate tracks.
type gatedConn struct {
	net.Conn
	g    *preauthGate
	addr string
	// ip is its ipGroup: its IPv4 address, or its IPv6 /64.
	ip string
	// Under g.mu: authenticated, the unauthenticated streams open, and
	// whether it made a call without credentials (a health check) while
	// unauthenticated: eviction picks such connections first.
	authenticated bool
	streams       int
	stranger      bool
	timer         *time.Timer
	closeOnce     sync.Once
	closeErr      error
}

// Close implements net.Conn: the gate forgets the connection.
func (c *gatedConn) Close() error {
	c.closeOnce.Do(func() {
		c.g.forget(c)
		c.closeErr = c.Conn.Close()
	})
	return c.closeErr
}

// listener wraps lis so the gate sees every connection it accepts.
func (g *preauthGate) listener(lis net.Listener) net.Listener {
	return gatedListener{Listener: lis, g: g}
}

type gatedListener struct {
	net.Listener
	g *preauthGate
}

func (l gatedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.g.admit(c), nil
}

// admit registers a new, unauthenticated connection, closing the ones it
// pushes over the caps.
func (g *preauthGate) admit(raw net.Conn) *gatedConn {
	c := &gatedConn{Conn: raw, g: g, addr: raw.RemoteAddr().String(), ip: ipGroup(raw.RemoteAddr())}
	var evict []*gatedConn
	g.mu.Lock()
	g.conns[c.addr] = c
	g.unauth[c.ip] = append(g.unauth[c.ip], c)
	g.nUnauth++
	if list := g.unauth[c.ip]; len(list) > g.maxPerIP {
		victim := victimLocked(list, c)
		evict = append(evict, victim)
		g.dropLocked(victim)
	}
	if g.nUnauth > g.maxConns {
		// The address holding the most gives way; among equals, the one
		// whose oldest connection is oldest.
		var victim *gatedConn
		for _, list := range g.unauth {
			if len(list) == 0 || list[0] == c {
				continue
			}
			if victim == nil || len(list) > len(g.unauth[victim.ip]) {
				victim = list[0]
			}
		}
		if victim != nil {
			victim = victimLocked(g.unauth[victim.ip], c)
			evict = append(evict, victim)
			g.dropLocked(victim)
		}
	}
	c.timer = time.AfterFunc(g.timeout, func() { g.expire(c) })
	g.mu.Unlock()
	for _, v := range evict {
		g.closed.WithLabelValues(closedEvicted).Inc()
		_ = v.Close()
	}
	return c
}

// victimLocked is the connection of list (one address's unauthenticated
// connections, oldest first, more than one) to close for the newcomer: the
// oldest that made a call without credentials (a stranger by its own
// word), else the oldest other than the newcomer. A tool server's
// connection that has not sent its first call yet is then closed only when
// its address holds no stranger's: a tool server sharing an address with
// strangers (one host, a NAT, a proxy) keeps its new connection.
func victimLocked(list []*gatedConn, newcomer *gatedConn) *gatedConn {
	for _, o := range list {
		if o.stranger && o != newcomer {
			return o
		}
	}
	if list[0] == newcomer {
		return list[1]
	}
	return list[0]
}

// dropLocked takes c out of the unauthenticated connections.
func (g *preauthGate) dropLocked(c *gatedConn) {
	list := g.unauth[c.ip]
	for i, o := range list {
		if o == c {
			list = append(list[:i:i], list[i+1:]...)
			g.nUnauth--
			break
		}
	}
	if len(list) == 0 {
		delete(g.unauth, c.ip)
	} else {
		g.unauth[c.ip] = list
	}
}

// expire closes c if it has not authenticated.
func (g *preauthGate) expire(c *gatedConn) {
	g.mu.Lock()
	authenticated := c.authenticated
	g.mu.Unlock()
	if !authenticated {
		g.closed.WithLabelValues(closedTimeout).Inc()
		_ = c.Close()
	}
}

// forget removes a closing connection.
func (g *preauthGate) forget(c *gatedConn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conns[c.addr] == c {
		delete(g.conns, c.addr)
	}
	if !c.authenticated {
		c.authenticated = true // counted no more
		g.dropLocked(c)
	}
	if c.timer != nil {
		c.timer.Stop()
	}
}

// tapHandle is the server's grpc.InTapHandle: it runs on each stream's
// headers, before grpc-go reads its message.
func (g *preauthGate) tapHandle(ctx context.Context, info *tap.Info) (context.Context, error) {
	authenticated, err := g.authn.Admit(ctx, info.FullMethodName)
	if err != nil {
		return nil, err
	}
	var c *gatedConn
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		g.mu.Lock()
		c = g.conns[p.Addr.String()]
		g.mu.Unlock()
	}
	if c == nil {
		// Not from the gate's listener, or closing.
		return ctx, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case authenticated:
		if !c.authenticated {
			c.authenticated = true
			g.dropLocked(c)
			c.timer.Stop()
		}
		return ctx, nil
	case c.authenticated:
		// A health check on a connection that authenticated: as any call.
		return ctx, nil
	case c.streams >= g.maxStreams:
		g.refused.Inc()
		return nil, grpcerr.New(codes.ResourceExhausted, dedupesvc.ReasonQuotaExceeded,
			"a connection that has not authenticated may hold "+strconv.Itoa(g.maxStreams)+" health checks at once (-max-unauthenticated-streams); send credentials, or wait for one to end",
			map[string]string{"quota": "unauthenticated_streams", "limit": strconv.Itoa(g.maxStreams)}, time.Second)
	}
	c.streams++
	c.stranger = true
	// grpc-go cancels a stream's context when the stream ends, however it
	// ends.
	context.AfterFunc(ctx, func() {
		g.mu.Lock()
		c.streams--
		g.mu.Unlock()
	})
	return ctx, nil
}

// ipGroup is what the per-IP cap counts addr's connections under: its
// IPv4 address, or its IPv6 /64 (httplimits.IPGroup, which the HTTP
// listeners' per-IP caps count by too).
var ipGroup = httplimits.IPGroup

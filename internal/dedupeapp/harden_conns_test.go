package dedupeapp_test

import (
	"bytes"
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// h2conn is a hostile HTTP/2 client: raw frames on one TCP connection,
// ignoring the server's settings, and costing no goroutine per stream.
type h2conn struct {
	net.Conn
	fr *http2.Framer
}

func dialH2(t *testing.T, addr string) *h2conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	h := &h2conn{Conn: c, fr: http2.NewFramer(c, c)}
	if err := h.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return h
}

// watch opens a Health.Watch stream with id.
func (h *h2conn) watch(t *testing.T, id uint32) {
	t.Helper()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/grpc.health.v1.Health/Watch"},
		{":authority", "dedupe"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	// An empty HealthCheckRequest: a 5-byte gRPC frame header, no payload.
	if err := h.fr.WriteData(id, true, []byte{0, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
}

// One connection cannot open more calls than -max-concurrent-streams: the
// excess is refused, and the server's goroutines stay bounded by the cap,
// not by what the client sends.
func TestStreamsPerConnectionAreCapped(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	const maxStreams, tries = 16, 1000
	addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), MaxConcurrentStreams: maxStreams})
	beginOnce(t, addr) // the service is up
	runtime.GC()
	before := runtime.NumGoroutine()

	h := dialH2(t, addr)
	refused := make(chan int, 1)
	pinged := make(chan struct{})
	go func() {
		n := 0
		defer func() { refused <- n }()
		for {
			f, err := h.fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.RSTStreamFrame:
				if f.ErrCode == http2.ErrCodeRefusedStream {
					n++
				}
			case *http2.PingFrame:
				if f.IsAck() {
					close(pinged)
				}
			}
		}
	}()
	for i := range uint32(tries) {
		h.watch(t, 2*i+1)
	}
	// The server reads frames in order: once it acknowledges this ping, it
	// has seen every stream above.
	if err := h.fr.WritePing(false, [8]byte{1}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-pinged:
	case <-time.After(2 * time.Minute):
		t.Fatal("no ping acknowledgement within 2 minutes")
	}
	grown := runtime.NumGoroutine() - before
	_ = h.Close()
	n := <-refused
	t.Logf("%d streams tried, %d refused, goroutines +%d", tries, n, grown)
	if grown > 4*maxStreams+64 {
		t.Fatalf("goroutines grew by %d for %d streams tried on one connection, want at most %d (bounded by the cap of %d)", grown, tries, 4*maxStreams+64, maxStreams)
	}
	if n < tries-maxStreams {
		t.Fatalf("%d streams refused, want at least %d", n, tries-maxStreams)
	}
}

// readUntilClosed reads frames until the server closes the connection (a
// GOAWAY, then EOF) and reports whether it did within limit.
func readUntilClosed(c net.Conn, limit time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(limit))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			var ne net.Error
			return !(errors.As(err, &ne) && ne.Timeout())
		}
	}
}

// An idle connection is closed after -max-connection-idle, and one that
// never finishes the HTTP/2 preface after -handshake-timeout.
func TestIdleAndSilentConnectionsAreClosed(t *testing.T) {
	t.Parallel()
	addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), MaxConnectionIdle: time.Second, HandshakeTimeout: time.Second})
	beginOnce(t, addr)
	idle := dialH2(t, addr)
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	// Generous bounds for a loaded machine; the limits are a second.
	if !readUntilClosed(idle, time.Minute) {
		t.Fatal("an idle connection is still open a minute after -max-connection-idle of 1s")
	}
	if !readUntilClosed(silent, time.Minute) {
		t.Fatal("a connection that sent nothing is still open a minute after -handshake-timeout of 1s")
	}
}

// Connections beyond -max-connections wait to be accepted until one closes.
func TestConnectionsAreCapped(t *testing.T) {
	t.Parallel()
	addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), MaxConnections: 2})
	settings := func(c net.Conn, limit time.Duration) bool {
		_ = c.SetReadDeadline(time.Now().Add(limit))
		f, err := http2.NewFramer(nil, c).ReadFrame()
		return err == nil && f.Header().Type == http2.FrameSettings
	}
	first, second := dialH2(t, addr), dialH2(t, addr)
	for _, c := range []*h2conn{first, second} {
		if !settings(c, time.Minute) {
			t.Fatal("a connection under the cap got no SETTINGS")
		}
	}
	third := dialH2(t, addr) // the kernel accepts it; the service does not yet
	if settings(third, 2*time.Second) {
		t.Fatal("a third connection was served with -max-connections 2")
	}
	_ = first.Close()
	if !settings(third, time.Minute) {
		t.Fatal("the waiting connection was not served after another closed")
	}
}

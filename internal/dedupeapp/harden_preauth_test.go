package dedupeapp_test

// Tests of issue 23: nothing a stranger sends before it authenticates can
// hurt the callers that do.

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// dialH2From is dialH2 from the local address ip (any of 127/8 on Linux),
// so a test can tell a stranger's connections from a tool server's.
func dialH2From(t *testing.T, ip, addr string) *h2conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	h := &h2conn{Conn: c, fr: http2.NewFramer(c, c)}
	// A large connection window, so the server's flow control does not
	// stop the stranger's bytes before the service decides.
	if err := h.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	return h
}

// bigRequest opens stream id on path with the given headers and sends a gRPC
// message header announcing length bytes, then part of them, never the
// last: the server, if it reads the message, holds a buffer of length
// bytes for the stream until it ends. part stays within the stream's first
// flow-control window (64 KiB).
func (h *h2conn) bigRequest(t *testing.T, id uint32, path string, length, part int, extra ...[2]string) {
	t.Helper()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range append([][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path},
		{":authority", "dedupe"}, {"content-type", "application/grpc"}, {"te", "trailers"}}, extra...) {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 5+part)
	binary.BigEndian.PutUint32(msg[1:5], uint32(length))
	for len(msg) > 0 {
		n := min(len(msg), 16<<10)
		if err := h.fr.WriteData(id, false, msg[:n]); err != nil {
			t.Fatal(err)
		}
		msg = msg[n:]
	}
}

// statuses reads frames until want streams have a grpc-status (or limit
// passes) and returns each stream's code; the other frames are ignored.
func (h *h2conn) statuses(t *testing.T, want int, limit time.Duration) map[uint32]codes.Code {
	t.Helper()
	got := map[uint32]codes.Code{}
	_ = h.SetReadDeadline(time.Now().Add(limit))
	dec := hpack.NewDecoder(4096, nil)
	for len(got) < want {
		f, err := h.fr.ReadFrame()
		if err != nil {
			t.Logf("reading frames: %v", err)
			return got
		}
		hf, ok := f.(*http2.HeadersFrame)
		if !ok {
			continue
		}
		fields, err := dec.DecodeFull(hf.HeaderBlockFragment())
		if err != nil {
			t.Fatal(err)
		}
		for _, field := range fields {
			if field.Name == "grpc-status" {
				n, _ := strconv.Atoi(field.Value)
				got[hf.StreamID] = codes.Code(n)
			}
		}
	}
	return got
}

// A call without credentials is refused from its headers, before grpc-go
// reads its message: the service answers UNAUTHENTICATED while the
// stranger's megabyte is still incomplete, so it never buffers one.
func TestUnauthenticatedCallIsRefusedBeforeItsMessage(t *testing.T) {
	t.Parallel()
	// A long -unauthenticated-timeout: a slow machine must not close the
	// stranger's connection before the test has sent everything.
	addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokenFile(t), UnauthenticatedTimeout: time.Hour})
	beginWith(t, addr, clientSecret)
	const streams = 8
	h := dialH2From(t, "127.0.0.2", addr)
	for i := range uint32(streams) {
		h.bigRequest(t, 2*i+1, idemgatev1.DedupeService_Begin_FullMethodName, 1<<20, 16<<10)
	}
	got := h.statuses(t, streams, time.Minute)
	if len(got) != streams {
		t.Fatalf("%d of %d unauthenticated calls with an incomplete message were answered within a minute, want all: the service is reading their messages", len(got), streams)
	}
	for id, code := range got {
		if code != codes.Unauthenticated {
			t.Errorf("stream %d: %s, want Unauthenticated", id, code)
		}
	}
}

// A connection that has not authenticated may hold only a few health
// checks at once (-max-unauthenticated-streams): the excess is refused
// from its headers, so strangers' health checks buffer at most
// connections x streams x receive limit.
func TestUnauthenticatedHealthStreamsPerConnectionAreCapped(t *testing.T) {
	t.Parallel()
	addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokenFile(t), UnauthenticatedTimeout: time.Hour})
	beginWith(t, addr, clientSecret)
	const streams = 10
	h := dialH2From(t, "127.0.0.2", addr)
	for i := range uint32(streams) {
		h.bigRequest(t, 2*i+1, "/grpc.health.v1.Health/Check", 1<<20, 16<<10)
	}
	want := streams - dedupeapp.DefaultMaxUnauthenticatedStreams
	got := h.statuses(t, want, time.Minute)
	if len(got) < want {
		t.Fatalf("%d of %d unauthenticated health checks with an incomplete message were refused within a minute, want %d (all over -max-unauthenticated-streams %d)",
			len(got), streams, want, dedupeapp.DefaultMaxUnauthenticatedStreams)
	}
	for id, code := range got {
		if code != codes.ResourceExhausted {
			t.Errorf("stream %d: %s, want ResourceExhausted", id, code)
		}
	}
}

// Strangers' idle connections cannot fill -max-connections: those that
// have not authenticated are capped below it, the oldest giving way, so a
// tool server's new connection still gets in and is served.
func TestUnauthenticatedConnectionsLeaveRoomForToolServers(t *testing.T) {
	t.Parallel()
	const maxConns = 8
	// A long -unauthenticated-timeout: the caps alone must make room.
	addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokenFile(t), MaxConnections: maxConns, UnauthenticatedTimeout: time.Hour})
	beginWith(t, addr, clientSecret)
	for range maxConns {
		h := dialH2From(t, "127.0.0.2", addr)
		h.watch(t, 1) // an unauthenticated Health.Watch, held open
	}
	for range maxConns {
		dialH2From(t, "127.0.0.3", addr) // idle
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := idemgatev1.NewDedupeServiceClient(dial(t, addr, withToken(clientSecret))).Begin(ctx, beginRequest("tool")); err != nil {
		t.Fatalf("a tool server's new connection, with %d strangers' connections open against -max-connections %d: %v", 2*maxConns, maxConns, err)
	}
}

// A connection that has not authenticated within
// -unauthenticated-timeout is closed, Health.Watch or not.
func TestUnauthenticatedConnectionsAreClosed(t *testing.T) {
	t.Parallel()
	addr := stacktest.ServeApp(t, dedupeapp.Config{DataDir: t.TempDir(), TokenFile: tokenFile(t), UnauthenticatedTimeout: time.Second})
	beginWith(t, addr, clientSecret)
	watching := dialH2From(t, "127.0.0.2", addr)
	watching.watch(t, 1)
	idle := dialH2From(t, "127.0.0.2", addr)
	// Generous bounds for a loaded machine; the limit is a second.
	if !readUntilClosed(watching, time.Minute) {
		t.Fatal("an unauthenticated Health.Watch connection is still open a minute after -unauthenticated-timeout of 1s")
	}
	if !readUntilClosed(idle, time.Minute) {
		t.Fatal("an unauthenticated idle connection is still open a minute after -unauthenticated-timeout of 1s")
	}
}

// beginWith makes one Begin with the bearer token secret; the service may
// still be starting.
func beginWith(t *testing.T, addr, secret string) {
	t.Helper()
	if _, err := idemgatev1.NewDedupeServiceClient(dial(t, addr, withToken(secret))).Begin(callCtx(t), beginRequest("ready")); err != nil {
		t.Fatal(err)
	}
}

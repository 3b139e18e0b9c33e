package main_test

import (
	"crypto/tls"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testing/certtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// The HTTPS listener's certificate rotates under a running bridge: a new
// connection gets the new one, without a restart, and a connection made
// before keeps its own.
func TestListenTLSCertificateRotates(t *testing.T) {
	t.Parallel()
	ca := certtest.NewCA(t, "CA")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	first, second := ca.Server(t, "bridge", time.Hour), ca.Server(t, "bridge", 2*time.Hour)
	certtest.Write(t, certFile, first.CertPEM)
	certtest.Write(t, keyFile, first.KeyPEM)
	addr := stacktest.FreeAddr(t)
	p := proctest.Start(t, proctest.Build(t, "."), []string{"-target", toolTarget(t), "-plaintext", "-listen", addr,
		"-listen-tls-cert", certFile, "-listen-tls-key", keyFile}, nil)
	p.WaitTCP(t, addr, 2*time.Minute)
	dial := func() *tls.Conn {
		t.Helper()
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr, &tls.Config{RootCAs: ca.Pool()})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	old := dial()
	defer old.Close()
	if got := old.ConnectionState().PeerCertificates[0]; !got.Equal(first.Cert) {
		t.Fatalf("before the rotation: serial %X, want %X", got.SerialNumber, first.Cert.SerialNumber)
	}
	certtest.Write(t, certFile, second.CertPEM)
	certtest.Write(t, keyFile, second.KeyPEM)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		c := dial()
		got := c.ConnectionState().PeerCertificates[0]
		c.Close()
		if got.Equal(second.Cert) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the rotation: new connections still get serial %X, want %X", got.SerialNumber, second.Cert.SerialNumber)
		}
	}
	// The connection made before still serves HTTP, on its certificate.
	if _, err := old.Write([]byte("GET /mcp HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 12)
	if _, err := old.Read(buf); err != nil || !strings.HasPrefix(string(buf), "HTTP/1.1 ") {
		t.Fatalf("the connection made before the rotation: %q, %v; want an HTTP answer", buf, err)
	}
	if !strings.Contains(p.Log(), "reloaded") {
		t.Errorf("no reload logged:\n%s", p.Log())
	}
}

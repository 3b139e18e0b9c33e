package tlsfiles

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthgrpc "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idemgate/idemgate/internal/testing/certtest"
	"github.com/idemgate/idemgate/internal/testing/testlog"
)

// clock is a settable time for the check interval.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func withClock(c *clock) Option { return func(o *options) { o.now = c.now } }

// setup writes pair to cert.pem and key.pem in a fresh directory and
// returns a KeyPair on them, its clock and its log.
func setup(t *testing.T, pair certtest.Issued) (k *KeyPair, certFile, keyFile string, c *clock, log *testlog.Buffer) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	certtest.Write(t, certFile, pair.CertPEM)
	certtest.Write(t, keyFile, pair.KeyPEM)
	c, log = &clock{}, &testlog.Buffer{}
	k, err := NewKeyPair("-tls-cert/-tls-key", certFile, keyFile, WithLogger(slog.New(slog.NewTextHandler(log, nil))), withClock(c))
	if err != nil {
		t.Fatal(err)
	}
	return k, certFile, keyFile, c, log
}

func serial(c *tls.Certificate) string { return fmt.Sprintf("%X", c.Leaf.SerialNumber) }

func TestKeyPair(t *testing.T) {
	ca := certtest.NewCA(t, "CA")

	t.Run("a rotated pair is served after the check interval, not before", func(t *testing.T) {
		first, second := ca.Server(t, "s", time.Hour), ca.Server(t, "s", 2*time.Hour)
		k, certFile, keyFile, c, log := setup(t, first)
		certtest.Write(t, certFile, second.CertPEM)
		certtest.Write(t, keyFile, second.KeyPEM)
		c.advance(DefaultCheckInterval - time.Nanosecond)
		if got := k.Certificate(); serial(got) != serial(&tls.Certificate{Leaf: first.Cert}) {
			t.Fatalf("inside the check interval: serial %s, want the first pair still (the files are checked at most once per interval)", serial(got))
		}
		c.advance(time.Nanosecond)
		got, _ := k.GetCertificate(nil)
		if !got.Leaf.Equal(second.Cert) || !k.NotAfter().Equal(second.Cert.NotAfter) {
			t.Fatalf("after the interval: serial %s, want the second pair's %X", serial(got), second.Cert.SerialNumber)
		}
		if want := fmt.Sprintf("reloaded\" path=%s,%s serial=%X", certFile, keyFile, second.Cert.SerialNumber); !strings.Contains(log.String(), want) {
			t.Errorf("log:\n%s\nwant it to name the new serial: %s", log, want)
		}
		if cc, _ := k.GetClientCertificate(nil); !cc.Leaf.Equal(second.Cert) {
			t.Errorf("GetClientCertificate serial %s, want the second pair's", serial(cc))
		}
	})

	t.Run("half a pair keeps the pair in force and logs once", func(t *testing.T) {
		first, second := ca.Server(t, "s", time.Hour), ca.Server(t, "s", 2*time.Hour)
		k, certFile, keyFile, c, log := setup(t, first)
		certtest.Write(t, certFile, second.CertPEM) // the key not yet
		for range 5 {
			c.advance(DefaultCheckInterval)
			if got := k.Certificate(); !got.Leaf.Equal(first.Cert) {
				t.Fatalf("with a certificate whose key is not there yet: serial %s, want the first pair", serial(got))
			}
		}
		if n := strings.Count(log.String(), "level=ERROR"); n != 1 || !strings.Contains(log.String(), "private key does not match public key") {
			t.Fatalf("%d errors logged, want one naming the mismatch:\n%s", n, log)
		}
		certtest.Write(t, keyFile, second.KeyPEM)
		c.advance(DefaultCheckInterval)
		if got := k.Certificate(); !got.Leaf.Equal(second.Cert) {
			t.Fatalf("once the key caught up: serial %s, want the second pair", serial(got))
		}
		// Another bad pair with the same error is logged again: it is new content.
		third := ca.Server(t, "s", 3*time.Hour)
		certtest.Write(t, certFile, third.CertPEM)
		c.advance(DefaultCheckInterval)
		if got := k.Certificate(); !got.Leaf.Equal(second.Cert) {
			t.Fatalf("third certificate without its key: serial %s, want the second pair", serial(got))
		}
		if n := strings.Count(log.String(), "level=ERROR"); n != 2 {
			t.Fatalf("%d errors logged, want a second one for the second bad pair:\n%s", n, log)
		}
	})

	t.Run("a file gone or unparsable keeps the pair in force", func(t *testing.T) {
		first := ca.Server(t, "s", time.Hour)
		k, certFile, _, c, log := setup(t, first)
		if err := os.Remove(certFile); err != nil {
			t.Fatal(err)
		}
		c.advance(DefaultCheckInterval)
		c.advance(DefaultCheckInterval)
		k.Certificate()
		c.advance(DefaultCheckInterval)
		if got := k.Certificate(); !got.Leaf.Equal(first.Cert) {
			t.Fatalf("certificate file gone: serial %s, want the pair in force", serial(got))
		}
		certtest.Write(t, certFile, []byte("-----BEGIN CERTIFICATE-----\ntruncat"))
		c.advance(DefaultCheckInterval)
		if got := k.Certificate(); !got.Leaf.Equal(first.Cert) {
			t.Fatalf("certificate file truncated: serial %s, want the pair in force", serial(got))
		}
		if n := strings.Count(log.String(), "level=ERROR"); n != 2 || !strings.Contains(log.String(), "no such file") {
			t.Fatalf("%d errors logged, want one for the missing file and one for the truncated one:\n%s", n, log)
		}
		// The same pair written again (a new modification time, the same
		// content) is no reload.
		certtest.Write(t, certFile, first.CertPEM)
		c.advance(DefaultCheckInterval)
		k.Certificate()
		if strings.Contains(log.String(), `reloaded"`) {
			t.Errorf("the pair in force written again was logged as a reload:\n%s", log)
		}
	})

	t.Run("a pair that does not match at start is refused", func(t *testing.T) {
		a, b := ca.Server(t, "s", time.Hour), ca.Server(t, "s", time.Hour)
		dir := t.TempDir()
		certtest.Write(t, filepath.Join(dir, "c"), a.CertPEM)
		certtest.Write(t, filepath.Join(dir, "k"), b.KeyPEM)
		_, err := NewKeyPair("-tls-cert/-tls-key", filepath.Join(dir, "c"), filepath.Join(dir, "k"))
		if err == nil || !strings.HasPrefix(err.Error(), "-tls-cert/-tls-key: ") || !strings.Contains(err.Error(), "does not match") {
			t.Fatalf("NewKeyPair = %v, want an error naming the flags and the mismatch", err)
		}
	})

	// Under -race: handshakes read the pair while it rotates.
	t.Run("concurrent use while the files rotate", func(t *testing.T) {
		first := ca.Server(t, "s", time.Hour)
		k, certFile, keyFile, c, _ := setup(t, first)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
						c.advance(time.Millisecond)
						if got, _ := k.GetCertificate(nil); got == nil || got.Leaf == nil {
							t.Error("no certificate")
							return
						}
					}
				}
			})
		}
		var last certtest.Issued
		for range 5 {
			last = ca.Server(t, "s", time.Hour)
			certtest.Write(t, certFile, last.CertPEM)
			certtest.Write(t, keyFile, last.KeyPEM)
		}
		close(stop)
		wg.Wait()
		c.advance(DefaultCheckInterval)
		if got := k.Certificate(); !got.Leaf.Equal(last.Cert) {
			t.Fatalf("after the rotations: serial %s, want the last pair's %X", serial(got), last.Cert.SerialNumber)
		}
	})
}

func TestCAPool(t *testing.T) {
	a, b := certtest.NewCA(t, "CA A"), certtest.NewCA(t, "CA B")
	file := filepath.Join(t.TempDir(), "ca.pem")
	certtest.Write(t, file, a.PEM)
	c, log := &clock{}, &testlog.Buffer{}
	p, err := NewCAPool("-tls-client-ca", file, WithLogger(slog.New(slog.NewTextHandler(log, nil))), withClock(c))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Pool().Equal(a.Pool()) {
		t.Fatal("the pool does not hold CA A")
	}
	certtest.Write(t, file, []byte("not PEM\n"))
	c.advance(DefaultCheckInterval)
	if !p.Pool().Equal(a.Pool()) {
		t.Fatal("a file without a certificate replaced the pool; want CA A kept")
	}
	if !strings.Contains(log.String(), "level=ERROR") {
		t.Errorf("no error logged for a bundle without a certificate:\n%s", log)
	}
	certtest.Write(t, file, append(append([]byte{}, a.PEM...), b.PEM...))
	c.advance(DefaultCheckInterval)
	if got := p.Pool(); !got.Equal(func() *x509.CertPool { q := a.Pool(); q.AddCert(b.Cert); return q }()) {
		t.Fatal("the bundle of both CAs did not replace the pool")
	}
	if !strings.Contains(log.String(), `cas="[CN=CA A CN=CA B]"`) {
		t.Errorf("log does not name the CAs in force:\n%s", log)
	}
	if _, err := NewCAPool("-tls-client-ca", filepath.Join(t.TempDir(), "none")); err == nil || !strings.HasPrefix(err.Error(), "-tls-client-ca: ") {
		t.Errorf("NewCAPool of a missing file = %v, want an error naming the flag", err)
	}
}

// A server on ServerConfig verifies client certificates against the CAs in
// force at each handshake, and serves the pair in force.
func TestServerConfig(t *testing.T) {
	serverCA, a, b := certtest.NewCA(t, "server CA"), certtest.NewCA(t, "CA A"), certtest.NewCA(t, "CA B")
	k, _, _, _, _ := setup(t, serverCA.Server(t, "s", time.Hour))
	file := filepath.Join(t.TempDir(), "ca.pem")
	certtest.Write(t, file, a.PEM)
	p, err := NewCAPool("-tls-client-ca", file, WithCheckInterval(-1), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := ServerConfig(&tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}, k, p)
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				_, _ = c.Write([]byte("ok"))
			}()
		}
	}()
	// admitted reports whether a client with a certificate from ca gets the
	// server's reply.
	admitted := func(ca *certtest.CA) bool {
		c, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{RootCAs: serverCA.Pool(), ServerName: "localhost",
			Certificates: []tls.Certificate{ca.Client(t, "spiffe://example.org/t").TLS(t)}})
		if err != nil {
			return false
		}
		defer c.Close()
		buf := make([]byte, 2)
		_, err = c.Read(buf)
		return err == nil
	}
	if !admitted(a) || admitted(b) {
		t.Fatal("before the rotation: want CA A's client admitted and CA B's refused")
	}
	certtest.Write(t, file, b.PEM)
	if admitted(a) || !admitted(b) {
		t.Fatal("after the rotation to CA B: want CA B's client admitted and CA A's refused")
	}
}

// ClientCredentials verify the server against the roots in force at each
// handshake.
func TestClientCredentials(t *testing.T) {
	a, b := certtest.NewCA(t, "CA A"), certtest.NewCA(t, "CA B")
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{b.Server(t, "s", time.Hour).TLS(t)}})))
	healthpb.RegisterHealthServer(srv, healthgrpc.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	file := filepath.Join(t.TempDir(), "ca.pem")
	certtest.Write(t, file, a.PEM)
	roots, err := NewCAPool("-tls-ca", file, WithCheckInterval(-1), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	creds := ClientCredentials(&tls.Config{MinVersion: tls.VersionTLS12}, roots)
	check := func() error {
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("trusting CA A only, a server with CA B's certificate: %v, want refused", err)
	}
	certtest.Write(t, file, b.PEM)
	if err := check(); err != nil {
		t.Fatalf("after the roots rotated to CA B: %v, want served", err)
	}
	if creds.Info().SecurityProtocol != "tls" || creds.Clone().Info().SecurityProtocol != "tls" {
		t.Errorf("Info = %+v, want tls", creds.Info())
	}
}

//go:build faults

package main_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/certtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// The serving certificate and the client CA bundle are files that rotate
// under a running service: a new connection gets the new certificate and
// is verified against the new CAs, with no restart, while a connection
// made before keeps serving; a half-written pair (a certificate without
// its key yet) leaves the pair in force serving.
func TestRotatedCertificatesReachNewConnections(t *testing.T) {
	dir := t.TempDir()
	caA, caB := certtest.NewCA(t, "CA A"), certtest.NewCA(t, "CA B")
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "client-ca.crt")
	first := caA.Server(t, "dedupe", 48*time.Hour)
	certtest.Write(t, certFile, first.CertPEM)
	certtest.Write(t, keyFile, first.KeyPEM)
	certtest.Write(t, caFile, caA.PEM)
	toolA, toolB := caA.Client(t, "spiffe://example.org/tool-a"), caB.Client(t, "spiffe://example.org/tool-b")

	addr, metrics := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	p := proctest.Start(t, proctest.Build(t, dedupesvcPkg),
		[]string{"-listen", addr, "-data-dir", filepath.Join(dir, "data"), "-metrics-listen", metrics,
			"-tls-cert", certFile, "-tls-key", keyFile, "-tls-client-ca", caFile},
		[]string{"DATABASE_URL="})
	p.WaitTCP(t, addr, 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	dial := func(client certtest.Issued) *grpc.ClientConn {
		t.Helper()
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: caA.Pool(), Certificates: []tls.Certificate{client.TLS(t)}, MinVersion: tls.VersionTLS12})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	n := 0
	// begin calls Begin on conn and returns the serial of the certificate
	// the service presented on the connection that carried it.
	begin := func(ctx context.Context, conn *grpc.ClientConn) (*big.Int, error) {
		n++
		var pr peer.Peer
		_, err := idemgatev1.NewDedupeServiceClient(conn).Begin(ctx, &idemgatev1.BeginRequest{Scope: "/tls.Test/Charge", Key: fmt.Sprint("k-", n),
			Fingerprint: make([]byte, 32), AttemptToken: "a-1", Lease: durationpb.New(30 * time.Second), Retention: durationpb.New(time.Hour)}, grpc.Peer(&pr))
		if err != nil {
			return nil, err
		}
		return pr.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber, nil
	}
	// served returns the serial a new connection is presented.
	served := func() *big.Int {
		t.Helper()
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr, &tls.Config{RootCAs: caA.Pool(), NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatalf("a new connection: %v", err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber
	}
	// eventually waits, generously, until a new connection is presented want.
	eventually := func(want *x509.Certificate, what string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			got := served()
			if got.Cmp(want.SerialNumber) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: new connections still get serial %X, want %X", what, got, want.SerialNumber)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	old := dial(toolA)
	if got, err := begin(ctx, old); err != nil || got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("Begin before the rotation: serial %X, %v; want %X", got, err, first.Cert.SerialNumber)
	}

	// The serving pair rotates: certificate first, then key, as two renames.
	second := caA.Server(t, "dedupe", 72*time.Hour)
	certtest.Write(t, certFile, second.CertPEM)
	certtest.Write(t, keyFile, second.KeyPEM)
	eventually(second.Cert, "after the pair rotated")
	if got, err := begin(ctx, old); err != nil || got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("Begin on the connection made before the rotation: serial %X, %v; want it served, still on %X", got, err, first.Cert.SerialNumber)
	}

	// Half a pair: the new certificate without its key. The pair in force
	// keeps serving, and the error is logged once.
	third := caA.Server(t, "dedupe", 96*time.Hour)
	certtest.Write(t, certFile, third.CertPEM)
	for deadline := time.Now().Add(time.Minute); !strings.Contains(p.Log(), "not reloaded"); {
		served()
		if time.Now().After(deadline) {
			t.Fatalf("no error logged for a certificate whose key does not match; log:\n%s", p.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for range 3 {
		time.Sleep(time.Second) // past the check interval, so each handshake rechecks
		if got := served(); got.Cmp(second.Cert.SerialNumber) != 0 {
			t.Fatalf("with half a pair on disk a new connection got serial %X, want the pair in force, %X", got, second.Cert.SerialNumber)
		}
	}
	if c := strings.Count(p.Log(), "not reloaded"); c != 1 {
		t.Errorf("the half-written pair was logged %d times, want once:\n%s", c, p.Log())
	}
	certtest.Write(t, keyFile, third.KeyPEM)
	eventually(third.Cert, "after the key caught up")
	if !strings.Contains(p.Log(), fmt.Sprintf("serial=%X", third.Cert.SerialNumber)) {
		t.Errorf("the log does not name the certificate now served (serial %X):\n%s", third.Cert.SerialNumber, p.Log())
	}
	if m := scrape(t, metrics); !strings.Contains(m, fmt.Sprintf("idemgate_tls_certificate_expiry_timestamp_seconds{certificate=\"server\"} %d", third.Cert.NotAfter.Unix())) &&
		!strings.Contains(m, fmt.Sprintf("idemgate_tls_certificate_expiry_timestamp_seconds{certificate=\"server\"} %g", float64(third.Cert.NotAfter.Unix()))) {
		t.Errorf("metrics do not show the served certificate's notAfter %d:\n%s", third.Cert.NotAfter.Unix(), grep(m, "idemgate_tls"))
	}

	// The client CA bundle rotates from CA A to CA B: a tool server with a
	// certificate from CA B is refused before and admitted after, one from
	// CA A is refused on a new connection, and the connection it already
	// has keeps serving.
	attempt, stop := context.WithTimeout(ctx, 30*time.Second)
	_, err := begin(attempt, dial(toolB))
	stop()
	if !refused(err) {
		t.Fatalf("tool B before the client CAs rotated: %v, want it refused", err)
	}
	certtest.Write(t, caFile, caB.PEM)
	for deadline := time.Now().Add(time.Minute); ; {
		attempt, stop := context.WithTimeout(ctx, 30*time.Second)
		_, err := begin(attempt, dial(toolB))
		stop()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tool B after the client CAs rotated to its CA: %v, want admitted", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	attempt, stop = context.WithTimeout(ctx, 30*time.Second)
	_, err = begin(attempt, dial(toolA))
	stop()
	if !refused(err) {
		t.Errorf("tool A on a new connection after its CA was dropped: %v, want it refused", err)
	}
	if _, err := begin(ctx, old); err != nil {
		t.Errorf("tool A on the connection made before its CA was dropped: %v, want it served", err)
	}
}

// refused reports whether err is the service refusing a caller whose
// client certificate its CAs did not sign: the client, seeing the CAs the
// server names, sends none, and is UNAUTHENTICATED.
func refused(err error) bool { return status.Code(err) == codes.Unauthenticated }

// scrape returns the metrics page at addr.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// grep returns the lines of s that contain sub.
func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

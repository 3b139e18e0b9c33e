// Package certtest issues throwaway certificates for tests: a CA, and the
// server and client certificates it signs, as PEM, each with a random
// serial, so a test can tell which certificate a peer presented.
package certtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority that lives for one test.
type CA struct {
	// Cert is the CA's certificate; PEM is it encoded.
	Cert *x509.Certificate
	PEM  []byte
	key  *ecdsa.PrivateKey
}

// Issued is a certificate a CA signed and its key.
type Issued struct {
	// Cert is the certificate; CertPEM and KeyPEM are it and its key
	// (PKCS #8) encoded.
	Cert            *x509.Certificate
	CertPEM, KeyPEM []byte
}

// NewCA returns a self-signed CA named name, valid for a day.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{SerialNumber: serial(tb), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	cert, certPEM := sign(tb, tmpl, tmpl, &key.PublicKey, key)
	return &CA{Cert: cert, PEM: certPEM, key: key}
}

// Pool returns a pool that trusts the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Server issues a server certificate for 127.0.0.1 and localhost that
// expires after validFor.
func (ca *CA) Server(tb testing.TB, name string, validFor time.Duration) Issued {
	tb.Helper()
	return ca.issue(tb, &x509.Certificate{Subject: pkix.Name{CommonName: name}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, validFor)
}

// Client issues a client certificate whose URI SAN is spiffeID (a caller's
// identity to the Dedupe service), valid for a day.
func (ca *CA) Client(tb testing.TB, spiffeID string) Issued {
	tb.Helper()
	u, err := url.Parse(spiffeID)
	if err != nil {
		tb.Fatal(err)
	}
	return ca.issue(tb, &x509.Certificate{Subject: pkix.Name{CommonName: u.Path}, URIs: []*url.URL{u},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, 24*time.Hour)
}

func (ca *CA) issue(tb testing.TB, tmpl *x509.Certificate, validFor time.Duration) Issued {
	tb.Helper()
	key := newKey(tb)
	tmpl.SerialNumber = serial(tb)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(validFor).Truncate(time.Second)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	cert, certPEM := sign(tb, tmpl, ca.Cert, &key.PublicKey, ca.key)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	return Issued{Cert: cert, CertPEM: certPEM, KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})}
}

// TLS returns the certificate and key as a tls.Certificate.
func (i Issued) TLS(tb testing.TB) tls.Certificate {
	tb.Helper()
	c, err := tls.X509KeyPair(i.CertPEM, i.KeyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Write replaces path with data the way certificate managers do: written
// beside it, then renamed over it, so a reader sees the old file or the new
// one, never half of one.
func Write(tb testing.TB, path string, data []byte) {
	tb.Helper()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".certtest-*")
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := tmp.Write(data); err != nil {
		tb.Fatal(err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		tb.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		tb.Fatal(err)
	}
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

func serial(tb testing.TB) *big.Int {
	tb.Helper()
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	if err != nil {
		tb.Fatal(err)
	}
	return s.Add(s, big.NewInt(1))
}

func sign(tb testing.TB, tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, key *ecdsa.PrivateKey) (*x509.Certificate, []byte) {
	tb.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"

	"google.golang.org/grpc/credentials"

	"github.com/idemgate/idemgate/internal/tlsfiles"
)

// toolCreds are the TLS credentials to the tool server: at each handshake
// the CAs in force (-tls-ca, else the system's) and the client certificate
// in force (-tls-cert/-tls-key, else none).
//
// They also say why the tool server dropped a connection when it asked for
// a client certificate. Under TLS 1.3 a server checks the client's
// certificate after the client's side of the handshake is done, so its
// refusal reaches the bridge on the first read (its alert) or the first
// write (a broken pipe, when the server has closed first), and neither names
// a certificate. An error on a connection whose tool server asked for one,
// before the tool server's first bytes, says which certificate the bridge
// sent, or that it had none.
type toolCreds struct {
	credentials.TransportCredentials // Info (ServerName) and the server side
	base                             *tls.Config
	roots                            *tlsfiles.CAPool  // nil: base.RootCAs
	pair                             *tlsfiles.KeyPair // nil: no client certificate
}

func newToolCreds(base *tls.Config, roots *tlsfiles.CAPool, pair *tlsfiles.KeyPair) *toolCreds {
	return &toolCreds{TransportCredentials: credentials.NewTLS(base), base: base.Clone(), roots: roots, pair: pair}
}

func (c *toolCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cfg := c.base.Clone()
	var asked atomic.Bool
	var sent atomic.Pointer[tls.Certificate]
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		asked.Store(true)
		if c.pair == nil {
			return &tls.Certificate{}, nil // none is sent, as with no GetClientCertificate
		}
		cert := c.pair.Certificate()
		sent.Store(cert)
		return cert, nil
	}
	creds := credentials.NewTLS(cfg)
	if c.roots != nil {
		creds = tlsfiles.ClientCredentials(cfg, c.roots)
	}
	tlsConn, info, err := creds.ClientHandshake(ctx, authority, conn)
	if !asked.Load() {
		return tlsConn, info, err
	}
	hint := "the tool server asked for a client certificate and the bridge has none (-tls-cert, -tls-key)"
	if cert := sent.Load(); cert != nil {
		hint = fmt.Sprintf("the tool server asked for a client certificate and may have refused the bridge's (-tls-cert: serial %X, subject %s, not after %s)",
			cert.Leaf.SerialNumber, cert.Leaf.Subject, cert.Leaf.NotAfter.UTC().Format("2006-01-02T15:04:05Z"))
	}
	if err != nil { // TLS 1.2: the refusal ends the handshake
		return nil, nil, fmt.Errorf("%s: %w", hint, err)
	}
	return &hintConn{Conn: tlsConn, hint: hint}, info, nil
}

func (c *toolCreds) Clone() credentials.TransportCredentials {
	return &toolCreds{TransportCredentials: c.TransportCredentials.Clone(), base: c.base.Clone(), roots: c.roots, pair: c.pair}
}

// OverrideServerName sets the name the tool server's certificate is
// verified for, as the credentials it wraps do.
func (c *toolCreds) OverrideServerName(name string) error {
	c.base.ServerName = name
	c.TransportCredentials = credentials.NewTLS(c.base)
	return nil
}

// hintConn adds its hint to the errors of its reads and writes until a read
// returns the tool server's first bytes: the tool server took the
// certificate then, and later errors are another story.
type hintConn struct {
	net.Conn
	hint     string
	accepted atomic.Bool
}

func (c *hintConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.accepted.Store(true)
	}
	return n, c.annotate(err)
}

func (c *hintConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	return n, c.annotate(err)
}

func (c *hintConn) annotate(err error) error {
	if err == nil || c.accepted.Load() {
		return err
	}
	return fmt.Errorf("%s: %w", c.hint, err)
}

// SyscallConn passes on the raw connection, as the connection grpc's TLS
// credentials return does.
func (c *hintConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.New("idemgate-mcp: the connection has no raw connection")
}

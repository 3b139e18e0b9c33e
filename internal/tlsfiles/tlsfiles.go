package tlsfiles

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
)

// DefaultCheckInterval is how long after one check of the files a
// handshake checks them again.
const DefaultCheckInterval = time.Second

type options struct {
	logger   *slog.Logger
	interval time.Duration
	now      func() time.Time
}

// Option configures a KeyPair or a CAPool.
type Option func(*options)

// WithLogger sets where reloads and files that cannot be used are logged.
// Defaults to slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithCheckInterval sets how long after one check a handshake checks the
// files again; zero or negative checks on every handshake. Defaults to
// DefaultCheckInterval (1s).
func WithCheckInterval(d time.Duration) Option { return func(o *options) { o.interval = d } }

func newOptions(opts []Option) options {
	o := options{logger: slog.Default(), interval: DefaultCheckInterval, now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// files is a set of files parsed together into a T, kept current by check.
type files[T any] struct {
	what  string // what the files are, in logs: "-tls-cert/-tls-key"
	paths []string
	parse func([][]byte) (T, error)
	attrs func(T) []any // what a reload logs
	o     options

	cur atomic.Pointer[loaded[T]]
	// nextCheck is when the files are next checked, as the time since
	// loadedAt: offsets from one time.Time keep the monotonic clock, so a
	// wall-clock step back cannot stop the checks.
	loadedAt  time.Time
	nextCheck atomic.Int64
	mu        sync.Mutex // one check at a time; guards failed
	failed    [sha256.Size]byte
}

type loaded[T any] struct {
	digest [sha256.Size]byte
	value  T
}

// load reads and parses the files once: an error here is the caller's to
// report (the process is starting).
func (f *files[T]) load() error {
	contents, digest, err := f.read()
	if err != nil {
		return err
	}
	v, err := f.parse(contents)
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Join(f.paths, ", "), err)
	}
	f.cur.Store(&loaded[T]{digest, v})
	f.loadedAt = f.o.now()
	f.nextCheck.Store(int64(f.o.interval))
	f.o.logger.Info(f.what+" loaded", append([]any{slog.String("path", strings.Join(f.paths, ","))}, f.attrs(v)...)...)
	return nil
}

// get returns what is in force, first checking the files if the interval
// has passed. A handshake that finds another checking does not wait for it.
func (f *files[T]) get() T {
	since := f.o.now().Sub(f.loadedAt)
	if int64(since) >= f.nextCheck.Load() && f.mu.TryLock() {
		f.nextCheck.Store(int64(since + f.o.interval))
		f.check()
		f.mu.Unlock()
	}
	return f.cur.Load().value
}

// check rereads the files and puts them in force if they changed and parse;
// otherwise what is in force stays, and a failure is logged once for as
// long as the files hold the same content. Called with mu held.
func (f *files[T]) check() {
	contents, digest, err := f.read()
	cur := f.cur.Load()
	if err == nil && digest == cur.digest {
		f.failed = [sha256.Size]byte{}
		return
	}
	var v T
	if err == nil {
		v, err = f.parse(contents)
	}
	if err != nil {
		key := sha256.Sum256(append(digest[:], err.Error()...))
		if key != f.failed {
			f.failed = key
			f.o.logger.Error(f.what+" not reloaded; the one in force stays: "+err.Error(), append([]any{slog.String("path", strings.Join(f.paths, ","))}, f.attrs(cur.value)...)...)
		}
		return
	}
	f.failed = [sha256.Size]byte{}
	f.cur.Store(&loaded[T]{digest, v})
	f.o.logger.Info(f.what+" reloaded", append([]any{slog.String("path", strings.Join(f.paths, ","))}, f.attrs(v)...)...)
}

// read returns the files' contents and one digest over all of them.
func (f *files[T]) read() ([][]byte, [sha256.Size]byte, error) {
	h := sha256.New()
	contents := make([][]byte, len(f.paths))
	for i, p := range f.paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, [sha256.Size]byte{}, err
		}
		contents[i] = b
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return contents, d, nil
}

// KeyPair is a certificate and its key read from two PEM files and reread
// when they change. Its methods are safe for concurrent use.
type KeyPair struct{ f files[*tls.Certificate] }

// NewKeyPair reads the certificate and key files, which must hold a
// matching pair now; later changes are read as the package doc says.
// what names the files in logs and errors (a flag pair: "-tls-cert/-tls-key").
func NewKeyPair(what, certFile, keyFile string, opts ...Option) (*KeyPair, error) {
	k := &KeyPair{files[*tls.Certificate]{what: "TLS certificate " + what, paths: []string{certFile, keyFile}, o: newOptions(opts),
		parse: func(c [][]byte) (*tls.Certificate, error) {
			cert, err := tls.X509KeyPair(c[0], c[1])
			if err != nil {
				return nil, err
			}
			return &cert, nil
		},
		attrs: func(c *tls.Certificate) []any {
			return []any{slog.String("serial", fmt.Sprintf("%X", c.Leaf.SerialNumber)), slog.String("subject", c.Leaf.Subject.String()),
				slog.Time("not_after", c.Leaf.NotAfter)}
		}}}
	if err := k.f.load(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return k, nil
}

// Certificate returns the pair in force, checking the files first if the
// check interval has passed.
func (k *KeyPair) Certificate() *tls.Certificate { return k.f.get() }

// NotAfter returns when the certificate in force expires, checking the
// files first as Certificate does (so a metrics scrape sees a rotation
// even while no connection comes).
func (k *KeyPair) NotAfter() time.Time { return k.f.get().Leaf.NotAfter }

// GetCertificate is a tls.Config.GetCertificate: a server presents the
// pair in force.
func (k *KeyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return k.f.get(), nil
}

// GetClientCertificate is a tls.Config.GetClientCertificate: a client
// presents the pair in force.
func (k *KeyPair) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return k.f.get(), nil
}

// CAPool is a pool of CA certificates read from a PEM file and reread when
// it changes. Its methods are safe for concurrent use.
type CAPool struct{ f files[caSet] }

// caSet is a parsed CA bundle: the pool, and its subjects for the log.
type caSet struct {
	pool     *x509.CertPool
	subjects []string
}

// NewCAPool reads the CA file, which must hold at least one PEM
// certificate now; later changes are read as the package doc says, and a
// change without a certificate, or with one that does not parse, keeps the
// pool in force. what names the file in logs and errors (its flag:
// "-tls-client-ca").
func NewCAPool(what, file string, opts ...Option) (*CAPool, error) {
	p := &CAPool{files[caSet]{what: "CA bundle " + what, paths: []string{file}, o: newOptions(opts), parse: parseCAs,
		attrs: func(s caSet) []any { return []any{slog.Any("cas", s.subjects)} }}}
	if err := p.f.load(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return p, nil
}

// parseCAs reads every CERTIFICATE block; one that does not parse fails
// the whole bundle (AppendCertsFromPEM would skip it and trust less).
func parseCAs(c [][]byte) (caSet, error) {
	s := caSet{pool: x509.NewCertPool()}
	for rest := c[0]; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return caSet{}, fmt.Errorf("certificate %d: %w", len(s.subjects)+1, err)
		}
		s.pool.AddCert(cert)
		s.subjects = append(s.subjects, cert.Subject.String())
	}
	if len(s.subjects) == 0 {
		return caSet{}, errors.New("no PEM certificate in it")
	}
	return s, nil
}

// Pool returns the pool in force, checking the file first if the check
// interval has passed.
func (p *CAPool) Pool() *x509.CertPool { return p.f.get().pool }

// ServerConfig returns base (cloned; nil is an empty config) serving pair's
// certificate and, when clientCAs is not nil, verifying client certificates
// given against clientCAs' pool with base.ClientAuth: each handshake takes
// what is in force. base must not set Certificates, GetCertificate or
// GetConfigForClient.
func ServerConfig(base *tls.Config, pair *KeyPair, clientCAs *CAPool) *tls.Config {
	cfg := base.Clone()
	if cfg == nil {
		cfg = &tls.Config{}
	}
	cfg.GetCertificate = pair.GetCertificate
	if clientCAs != nil {
		template := cfg.Clone()
		cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := template.Clone()
			c.ClientCAs = clientCAs.Pool()
			return c, nil
		}
	}
	return cfg
}

// ClientCredentials returns gRPC transport credentials that verify the
// server against roots' pool in force at each handshake, with base (which
// must not set RootCAs) for everything else; a client certificate that
// rotates goes in base as a KeyPair's GetClientCertificate.
func ClientCredentials(base *tls.Config, roots *CAPool) credentials.TransportCredentials {
	return &clientCreds{base: base.Clone(), roots: roots, TransportCredentials: credentials.NewTLS(base)}
}

// clientCreds makes each client handshake with a tls.Config holding the
// roots in force; the embedded credentials answer Info and server-side calls.
type clientCreds struct {
	credentials.TransportCredentials
	base  *tls.Config
	roots *CAPool
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cfg := c.base.Clone()
	cfg.RootCAs = c.roots.Pool()
	return credentials.NewTLS(cfg).ClientHandshake(ctx, authority, conn)
}

func (c *clientCreds) Clone() credentials.TransportCredentials {
	return &clientCreds{base: c.base.Clone(), roots: c.roots, TransportCredentials: c.TransportCredentials.Clone()}
}

// OverrideServerName sets the name the server's certificate is verified
// for, as the credentials it wraps do.
func (c *clientCreds) OverrideServerName(name string) error {
	c.base.ServerName = name
	return nil
}

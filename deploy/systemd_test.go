package deploy_test

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
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc/auth"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

const (
	unitFile    = "systemd/dedupesvc.service"
	unitEnvFile = "systemd/dedupesvc.env"
)

func requireSystemdAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("systemd-analyze is missing (CI=true, so this fails; apt-get install systemd): %v", err)
		}
		t.Skipf("systemd-analyze is missing (apt-get install systemd): %v", err)
	}
	return p
}

// localUnit is the unit with its binary and environment file where this
// test has them, written to a temporary file named dedupesvc.service.
func localUnit(t *testing.T, bin string) string {
	t.Helper()
	b, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	envFile, _ := filepath.Abs(unitEnvFile)
	s := strings.Replace(string(b), "ExecStart=/usr/local/bin/dedupesvc", "ExecStart="+bin, 1)
	s = strings.Replace(s, "EnvironmentFile=/etc/idemgate/dedupesvc.env", "EnvironmentFile="+envFile, 1)
	if s == string(b) {
		t.Fatal("the unit's ExecStart or EnvironmentFile moved: update this test")
	}
	path := filepath.Join(t.TempDir(), "dedupesvc.service")
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// The unit passes systemd-analyze verify without a word, and its sandbox
// rates "OK" or better in systemd-analyze security (exposure at most 2.0 of
// 10), offline: this machine runs no systemd.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze := requireSystemdAnalyze(t)
	unit := localUnit(t, proctest.Build(t, "github.com/idemgate/idemgate/cmd/dedupesvc"))
	if out, err := exec.Command(analyze, "verify", unit).CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err := exec.Command(analyze, "security", "--offline=true", unit).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for dedupesvc.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security printed no exposure level:\n%s", out)
	}
	if level, _ := strconv.ParseFloat(string(m[1]), 64); level > 2.0 {
		t.Errorf("exposure level %.1f, want at most 2.0:\n%s", level, out)
	}
}

// unitEnvironment is the environment the unit gives the service: its
// EnvironmentFile, then its Environment= lines, with %d (the credentials
// directory) and %S (the state directory root) as given.
func unitEnvironment(t *testing.T, credentials, state string) map[string]string {
	t.Helper()
	env := map[string]string{}
	f, err := os.Open(unitEnvFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not NAME=value", unitEnvFile, line)
		}
		env[k] = v
	}
	b, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "Environment=")
		if !ok {
			continue
		}
		for _, kv := range strings.Fields(rest) {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = strings.NewReplacer("%d", credentials, "%S", state).Replace(v)
		}
	}
	return env
}

// The service starts with the environment and credential files the unit
// gives it (not under systemd: the sandbox directives are checked by
// TestSystemdUnitVerifies only), listening on all addresses with TLS, and
// serves a caller that presents the client certificate and the token.
func TestSystemdUnitEnvironmentServes(t *testing.T) {
	dir := t.TempDir()
	creds, state := filepath.Join(dir, "credentials"), filepath.Join(dir, "state")
	for _, d := range []string{creds, state} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ca, caKey := newCA(t)
	writePEM(t, filepath.Join(creds, "client-ca"), "CERTIFICATE", ca.Raw)
	serverCert, serverKey := leaf(t, ca, caKey, "dedupe.internal", x509.ExtKeyUsageServerAuth)
	writePEM(t, filepath.Join(creds, "tls-cert"), "CERTIFICATE", serverCert)
	writePEM(t, filepath.Join(creds, "tls-key"), "PRIVATE KEY", serverKey)
	clientCert, clientKey := leaf(t, ca, caKey, "tool-server", x509.ExtKeyUsageClientAuth)
	if err := os.WriteFile(filepath.Join(creds, "tokens"), []byte("tool-server client s3cret-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	env := unitEnvironment(t, creds, state)
	for _, k := range []string{"DATABASE_URL", "IDEMGATE_LISTEN", "IDEMGATE_TLS_CERT", "IDEMGATE_TLS_KEY", "IDEMGATE_TLS_CLIENT_CA", "IDEMGATE_TOKEN_FILE"} {
		if env[k] == "" {
			t.Fatalf("the unit sets no %s", k)
		}
	}
	if host, _, _ := net.SplitHostPort(env["IDEMGATE_LISTEN"]); host != "0.0.0.0" {
		t.Fatalf("IDEMGATE_LISTEN = %s, want all addresses", env["IDEMGATE_LISTEN"])
	}
	// This test's database and free ports; all else as the unit says.
	_, port, _ := net.SplitHostPort(stacktest.FreeAddr(t))
	env["DATABASE_URL"] = pgtest.SchemaURL(t)
	env["IDEMGATE_LISTEN"] = "0.0.0.0:" + port
	env["IDEMGATE_METRICS_LISTEN"] = stacktest.FreeAddr(t)
	var environ []string
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	p := proctest.Start(t, proctest.Build(t, "github.com/idemgate/idemgate/cmd/dedupesvc"), nil, environ)
	p.WaitTCP(t, "127.0.0.1:"+port, 2*time.Minute)

	pool := x509.NewCertPool()
	pool.AddCert(ca)
	keyPair, err := tls.X509KeyPair(pemBytes("CERTIFICATE", clientCert), pemBytes("PRIVATE KEY", clientKey))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("127.0.0.1:"+port,
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "dedupe.internal", Certificates: []tls.Certificate{keyPair}, MinVersion: tls.VersionTLS12})),
		grpc.WithPerRPCCredentials(auth.BearerToken("s3cret-token-0123456789", false)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := idemgatev1.NewDedupeServiceClient(conn).Begin(ctx, &idemgatev1.BeginRequest{
		Scope: "/systemd.Test/Charge", Key: "k-1", Fingerprint: make([]byte, 32), AttemptToken: "attempt-1",
		Lease: durationpb.New(10 * time.Second), Retention: durationpb.New(time.Hour),
	})
	if err != nil {
		t.Fatalf("Begin through the unit's TLS and token settings: %v", err)
	}
	if res.GetReserved() == nil {
		t.Fatalf("Begin = %v, want the reservation", res)
	}
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// leaf returns a certificate signed by ca for name, and its PKCS #8 key.
func leaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, usage x509.ExtKeyUsage) (cert, key []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	cert, err = x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err = x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func pemBytes(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pemBytes(kind, der), 0o600); err != nil {
		t.Fatal(err)
	}
}

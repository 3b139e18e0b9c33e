package deploy_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/durationpb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// The documented certificates, made as written with OpenSSL, and the
// service started as written: a tool server's records are namespaced by
// its SPIFFE ID, which idemctl shows to the admin identity and refuses to
// the tool server.
func TestTLSIdentitiesAsDocumented(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatalf("openssl is missing (apt-get install openssl): %v", err)
	}
	dir := t.TempDir()
	for _, pkg := range []string{"dedupesvc", "idemctl"} {
		if err := os.Symlink(proctest.Build(t, "github.com/idemgate/idemgate/cmd/"+pkg), filepath.Join(dir, pkg)); err != nil {
			t.Fatal(err)
		}
	}
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		t.Fatal(err)
	}
	listen := stacktest.FreeAddr(t)
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", docBlock(t, "tls-certificates")+"\nwait\n")
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "LISTEN="+listen, "DATABASE_URL=",
		// An empty variable is as good as unset: a port of its own keeps the
		// default 9464 free for anything else on the machine.
		"IDEMGATE_DATA_DIR="+filepath.Join(dir, "data"), "IDEMGATE_METRICS_LISTEN="+stacktest.FreeAddr(t))
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("the documented commands printed:\n%s", log.String())
		}
	})
	waitTCP(t, listen, 2*time.Minute)

	pool := x509.NewCertPool()
	ca, err := os.ReadFile(filepath.Join(work, "ca.crt"))
	if err != nil || !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("ca.crt: %v", err)
	}
	tool, err := tls.LoadX509KeyPair(filepath.Join(work, "payments-tool.crt"), filepath.Join(work, "payments-tool.key"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(listen, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{tool}, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := idemgatev1.NewDedupeServiceClient(conn).Begin(ctx, &idemgatev1.BeginRequest{Scope: "/tls.Test/Charge", Key: "order-tls",
		Fingerprint: make([]byte, 32), AttemptToken: "a-1", Lease: durationpb.New(30 * time.Second), Retention: durationpb.New(time.Hour)}); err != nil {
		t.Fatalf("Begin as payments-tool: %v", err)
	}

	idemctl := func(name string) ([]byte, error) {
		c := exec.Command(filepath.Join(dir, "idemctl"), "-addr", listen, "-tls-ca", "ca.crt", "-tls-cert", name+".crt", "-tls-key", name+".key", "list")
		c.Dir = work
		return c.CombinedOutput()
	}
	out, err := idemctl("ops")
	if err != nil || !bytes.Contains(out, []byte("spiffe://example.org/payments-tool")) || !bytes.Contains(out, []byte("order-tls")) {
		t.Errorf("idemctl list as ops: %v\n%s\nwant the record under spiffe://example.org/payments-tool", err, out)
	}
	if out, err := idemctl("payments-tool"); err == nil || !bytes.Contains(bytes.ToLower(out), []byte("permission")) {
		t.Errorf("idemctl list as payments-tool: %v\n%s\nwant it refused, not an admin identity", err, out)
	}
}

// waitTCP waits until addr accepts a connection.
func waitTCP(t *testing.T, addr string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s accepted no connection within %s: %v", addr, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

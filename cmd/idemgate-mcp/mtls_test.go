package main_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/protoset"
	"github.com/idemgate/idemgate/internal/testing/certtest"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
	"github.com/idemgate/idemgate/internal/testing/testsvc"
)

const mutateTool = "idemgate.testing.v1.TestService.Mutate"

// mtlsTool is a gated tool server (the test service behind the
// interceptor, with its default tenant, interceptor.PeerTenant) that
// requires a client certificate its CA signed, as a tool server that names
// its tenants by certificate does.
type mtlsTool struct {
	addr   string
	caFile string // the CA that signs its certificate and its callers'
	ca     *certtest.CA
	svc    *testsvc.Server

	mu      sync.Mutex
	scopes  []string   // the scope of every Begin the gate sent: method|tenant
	serials []*big.Int // the client certificate of every call, by serial
	conns   []net.Conn // the connections accepted, to drop them
}

// startMTLSTool starts one, speaking TLS up to maxVersion (0: 1.3).
func startMTLSTool(t *testing.T, maxVersion uint16) *mtlsTool {
	t.Helper()
	tool := &mtlsTool{ca: certtest.NewCA(t, "CA"), svc: &testsvc.Server{}}
	tool.caFile = filepath.Join(t.TempDir(), "ca.crt")
	certtest.Write(t, tool.caFile, tool.ca.PEM)
	// The Dedupe service, on the embedded store; its client records the
	// scope each Begin asks for, which is the record's.
	stack := stacktest.StartEmbedded(t, func(*grpc.Server) {}, stacktest.Config{
		DedupeClientInterceptor: func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if b, ok := req.(*idemgatev1.BeginRequest); ok {
				tool.mu.Lock()
				tool.scopes = append(tool.scopes, b.GetScope())
				tool.mu.Unlock()
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}})
	gate, err := interceptor.New(stack.Dedupe, interceptor.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(ctx)
	})
	recordPeer := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if p, ok := peer.FromContext(ctx); ok {
			if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
				tool.mu.Lock()
				tool.serials = append(tool.serials, ti.State.PeerCertificates[0].SerialNumber)
				tool.mu.Unlock()
			}
		}
		return handler(ctx, req)
	}
	server := tool.ca.Server(t, "tool", time.Hour).TLS(t)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{server},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: tool.ca.Pool(), MinVersion: tls.VersionTLS12, MaxVersion: maxVersion})),
		grpc.ChainUnaryInterceptor(recordPeer, gate.UnaryServerInterceptor()))
	testingv1.RegisterTestServiceServer(srv, tool.svc)
	reflection.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tool.addr = lis.Addr().String()
	go func() { _ = srv.Serve(trackingListener{lis, tool}) }()
	t.Cleanup(srv.Stop)
	return tool
}

// trackingListener keeps the connections it accepts, so a test can drop
// them and make the bridge connect (and shake hands) again.
type trackingListener struct {
	net.Listener
	tool *mtlsTool
}

func (l trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.tool.mu.Lock()
		l.tool.conns = append(l.tool.conns, c)
		l.tool.mu.Unlock()
	}
	return c, err
}

// dropConnections closes every connection accepted so far.
func (tool *mtlsTool) dropConnections() {
	tool.mu.Lock()
	defer tool.mu.Unlock()
	for _, c := range tool.conns {
		_ = c.Close()
	}
	tool.conns = nil
}

func (tool *mtlsTool) lastSerial() *big.Int {
	tool.mu.Lock()
	defer tool.mu.Unlock()
	if len(tool.serials) == 0 {
		return nil
	}
	return tool.serials[len(tool.serials)-1]
}

// writePair writes a client certificate and its key to dir.
func writePair(t *testing.T, dir string, c certtest.Issued) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	certtest.Write(t, certFile, c.CertPEM)
	certtest.Write(t, keyFile, c.KeyPEM)
	return certFile, keyFile
}

// startBridge runs the bridge binary over HTTP in front of tool with args
// and env added, and returns it and its /mcp URL.
func startBridge(t *testing.T, tool *mtlsTool, env []string, args ...string) (*proctest.Process, string) {
	t.Helper()
	addr := stacktest.FreeAddr(t)
	p := proctest.Start(t, proctest.Build(t, "."), append([]string{"-target", tool.addr, "-tls-ca", tool.caFile, "-listen", addr}, args...), env)
	p.WaitTCP(t, addr, 2*time.Minute)
	return p, "http://" + addr + "/mcp"
}

// mutate calls the test service's Mutate through the bridge at url with
// key, and returns the result and the execution it reports.
func mutate(ctx context.Context, t *testing.T, url, key string) (*mcp.CallToolResult, float64) {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: mutateTool, Arguments: map[string]any{"payload": "x"},
		Meta: mcp.Meta{mcpbridge.MetaKey: key}})
	if err != nil {
		t.Fatal(err)
	}
	structured, _ := res.StructuredContent.(map[string]any)
	execution, _ := structured["execution"].(float64)
	return res, execution
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// Against a tool server that requires a client certificate, a bridge
// without -tls-cert/-tls-key, or with one the tool server does not trust,
// is refused by the handshake, and its caller reads which certificate the
// bridge sent. Under TLS 1.3 the refusal comes after the bridge's side of
// the handshake, as the tool server's alert or, when the tool server has
// closed first, a broken pipe; under TLS 1.2 it ends the handshake.
func TestClientCertificateRefusalIsNamed(t *testing.T) {
	t.Parallel()
	// Without a certificate the bridge cannot read the services by
	// reflection, so it is given them.
	set, err := protoset.Build(protoregistry.GlobalFiles, "idemgate/testing/v1/testing.proto")
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	descriptors := filepath.Join(t.TempDir(), "testing.binpb")
	if err := os.WriteFile(descriptors, b, 0o600); err != nil {
		t.Fatal(err)
	}
	stranger := certtest.NewCA(t, "another CA").Client(t, "spiffe://idemgate.test/stranger")
	strangerCert, strangerKey := writePair(t, t.TempDir(), stranger)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		tool := startMTLSTool(t, version)
		for _, tc := range []struct {
			name string
			args []string
			want string
		}{
			{"no certificate", nil, "the tool server asked for a client certificate and the bridge has none (-tls-cert, -tls-key): "},
			{"another CA's certificate", []string{"-tls-cert", strangerCert, "-tls-key", strangerKey},
				fmt.Sprintf("the tool server asked for a client certificate and may have refused the bridge's (-tls-cert: serial %X, subject CN=/stranger, not after ", stranger.Cert.SerialNumber)},
		} {
			_, url := startBridge(t, tool, nil, append([]string{"-descriptor-set", descriptors}, tc.args...)...)
			res, _ := mutate(ctx, t, url, "order-1")
			if text := resultText(res); !res.IsError || !strings.HasPrefix(text, "UNAVAILABLE: ") || !strings.Contains(text, tc.want) {
				t.Errorf("%s, %s: %q (error %v), want UNAVAILABLE saying %q", tls.VersionName(version), tc.name, text, res.IsError, tc.want)
			}
		}
		if n := tool.svc.Executions(); n != 0 {
			t.Errorf("%s: %d executions, want 0", tls.VersionName(version), n)
		}
	}
}

// A bridge with -tls-cert/-tls-key is served by a tool server that
// requires a client certificate, and the tool server's gate names it by its
// certificate: two bridges with different certificates are two tenants, so
// one key is two actions, each run once and replayed only to its own
// bridge, each recorded under its bridge's SPIFFE ID.
func TestClientCertificateNamesTheTenant(t *testing.T) {
	t.Parallel()
	tool := startMTLSTool(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := tool.ca.Client(t, "spiffe://idemgate.test/bridge-a")
	certA, keyA := writePair(t, t.TempDir(), a)
	_, urlA := startBridge(t, tool, nil, "-tls-cert", certA, "-tls-key", keyA)
	// Bridge B's pair comes from the environment.
	certB, keyB := writePair(t, t.TempDir(), tool.ca.Client(t, "spiffe://idemgate.test/bridge-b"))
	_, urlB := startBridge(t, tool, []string{"IDEMGATE_MCP_TLS_CERT=" + certB, "IDEMGATE_MCP_TLS_KEY=" + keyB})

	executions := map[string]float64{}
	for _, call := range []struct {
		bridge, url string
		replayed    bool
	}{{"A", urlA, false}, {"B", urlB, false}, {"A", urlA, true}, {"B", urlB, true}} {
		res, execution := mutate(ctx, t, call.url, "order-1")
		if res.IsError {
			t.Fatalf("bridge %s: %s", call.bridge, resultText(res))
		}
		if got := res.Meta[mcpbridge.MetaReplayed] == true; got != call.replayed {
			t.Errorf("bridge %s, key order-1: replayed = %v, want %v", call.bridge, got, call.replayed)
		}
		if first, ok := executions[call.bridge]; ok && first != execution {
			t.Errorf("bridge %s's retry got execution %v, want its own %v", call.bridge, execution, first)
		}
		executions[call.bridge] = execution
	}
	if executions["A"] == executions["B"] {
		t.Errorf("bridges A and B got the same execution %v for key order-1: one tenant", executions["A"])
	}
	if n := tool.svc.Executions(); n != 2 {
		t.Errorf("%d executions, want one per bridge", n)
	}
	tool.mu.Lock()
	defer tool.mu.Unlock()
	scopes := map[string]bool{
		"/idemgate.testing.v1.TestService/Mutate|spiffe://idemgate.test/bridge-a": true,
		"/idemgate.testing.v1.TestService/Mutate|spiffe://idemgate.test/bridge-b": true,
	}
	seen := map[string]bool{}
	for _, scope := range tool.scopes {
		if !scopes[scope] {
			t.Errorf("a record in scope %q, want each bridge's SPIFFE ID as its tenant", scope)
		}
		seen[scope] = true
	}
	for scope := range scopes {
		if !seen[scope] {
			t.Errorf("no record in scope %q", scope)
		}
	}
}

// A renewed client certificate (same identity, new serial) written over
// the files reaches the tool server on the bridge's next connection,
// without a restart; the tenant stays the same, so a key used before the
// renewal replays after it.
func TestClientCertificateRotates(t *testing.T) {
	t.Parallel()
	tool := startMTLSTool(t, 0)
	first, second := tool.ca.Client(t, "spiffe://idemgate.test/bridge"), tool.ca.Client(t, "spiffe://idemgate.test/bridge")
	certFile, keyFile := writePair(t, t.TempDir(), first)
	p, url := startBridge(t, tool, nil, "-tls-cert", certFile, "-tls-key", keyFile)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, execution := mutate(ctx, t, url, "k-1")
	if res.IsError {
		t.Fatal(resultText(res))
	}
	if got := tool.lastSerial(); got == nil || got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("the tool server saw serial %X, want the first certificate's %X", got, first.Cert.SerialNumber)
	}

	certtest.Write(t, certFile, second.CertPEM)
	certtest.Write(t, keyFile, second.KeyPEM)
	// The files are checked at most once a second, on a handshake: drop the
	// connection until a new one presents the renewed certificate.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		tool.dropConnections()
		res, got := mutate(ctx, t, url, "k-1")
		if res.IsError {
			// A call that met the dropped connection; the next one dials.
			if text := resultText(res); !strings.HasPrefix(text, "UNAVAILABLE") {
				t.Fatalf("after the rotation: %s", text)
			}
			continue
		}
		if res.Meta[mcpbridge.MetaReplayed] != true || got != execution {
			t.Fatalf("key k-1 after the renewal: replayed %v, execution %v; want the replay of execution %v (one tenant)", res.Meta[mcpbridge.MetaReplayed], got, execution)
		}
		if s := tool.lastSerial(); s.Cmp(second.Cert.SerialNumber) == 0 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("after the rotation: new connections still present serial %X, want %X", s, second.Cert.SerialNumber)
		}
	}
	if n := tool.svc.Executions(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
	if !strings.Contains(p.Log(), "-tls-cert/-tls-key reloaded") {
		t.Errorf("no reload logged:\n%s", p.Log())
	}
}

// -tls-cert and -tls-key are refused at start, naming the problem: one
// without the other, either with -plaintext, and a pair that does not
// match or cannot be read.
func TestClientCertificateFlagsAreChecked(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t, ".")
	ca := certtest.NewCA(t, "CA")
	certFile, keyFile := writePair(t, t.TempDir(), ca.Client(t, "spiffe://idemgate.test/a"))
	_, otherKey := writePair(t, t.TempDir(), ca.Client(t, "spiffe://idemgate.test/b"))
	missing := filepath.Join(t.TempDir(), "missing.crt")
	for _, tc := range []struct {
		args []string
		exit int
		want string
	}{
		{[]string{"-tls-cert", certFile}, 2, "-tls-cert and -tls-key go together"},
		{[]string{"-tls-key", keyFile}, 2, "-tls-cert and -tls-key go together"},
		{[]string{"-plaintext", "-tls-cert", certFile, "-tls-key", keyFile}, 2, "-tls-cert and -tls-key are a client certificate for TLS to the tool server: not with -plaintext"},
		{[]string{"-tls-cert", certFile, "-tls-key", otherKey}, 1, "-tls-cert/-tls-key: " + certFile + ", " + otherKey + ": tls: private key does not match public key"},
		{[]string{"-tls-cert", missing, "-tls-key", keyFile}, 1, "-tls-cert/-tls-key: open " + missing},
	} {
		out, err := exec.Command(bin, append([]string{"-target", "127.0.0.1:1", "-descriptor-set", "unused.binpb"}, tc.args...)...).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != tc.exit {
			t.Errorf("%q: %v, want exit status %d\n%s", tc.args, err, tc.exit, out)
		}
		if !strings.Contains(string(out), tc.want) {
			t.Errorf("%q: output\n%s\nwant %q", tc.args, out, tc.want)
		}
	}
}

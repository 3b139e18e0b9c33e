package auth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

const (
	secretA = "token-of-service-a-0123456789"
	secretB = "token-of-service-b-0123456789"
)

func startServer(t *testing.T, a *auth.Authenticator, opts ...grpc.ServerOption) string {
	t.Helper()
	srv := grpc.NewServer(append(opts, grpc.ChainUnaryInterceptor(a.UnaryServerInterceptor()))...)
	idemgatev1.RegisterDedupeServiceServer(srv, dedupesvc.NewServer(pgstore.New(pgtest.Pool(t))))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func client(t *testing.T, addr string, opts ...grpc.DialOption) idemgatev1.DedupeServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return idemgatev1.NewDedupeServiceClient(conn)
}

func beginReq(token string) *idemgatev1.BeginRequest {
	fp := sha256.Sum256([]byte("charge"))
	return &idemgatev1.BeginRequest{Scope: "/payments.v1.Payments/Charge", Key: "order-1", Fingerprint: fp[:], AttemptToken: token,
		Lease: durationpb.New(time.Second), Retention: durationpb.New(time.Hour)}
}

func TestTokensIsolateServices(t *testing.T) {
	t.Parallel()
	a, err := auth.New(auth.Config{Tokens: []auth.Token{{Name: "service-a", Secret: secretA}, {Name: "service-b", Secret: secretB}}})
	if err != nil {
		t.Fatal(err)
	}
	addr := startServer(t, a)
	plain := grpc.WithTransportCredentials(insecure.NewCredentials())
	anonymous := client(t, addr, plain)
	serviceA := client(t, addr, plain, grpc.WithPerRPCCredentials(auth.BearerToken(secretA, true)))
	serviceB := client(t, addr, plain, grpc.WithPerRPCCredentials(auth.BearerToken(secretB, true)))
	forged := client(t, addr, plain, grpc.WithPerRPCCredentials(auth.BearerToken("not-a-valid-token-at-all", true)))
	ctx := context.Background()

	for name, c := range map[string]idemgatev1.DedupeServiceClient{"no credentials": anonymous, "a wrong token": forged} {
		_, err := c.Begin(ctx, beginReq("x"))
		if status.Code(err) != codes.Unauthenticated || grpcerr.Reason(err) != auth.ReasonUnauthenticated {
			t.Errorf("%s: %v, want UNAUTHENTICATED %s", name, err, auth.ReasonUnauthenticated)
		}
	}

	// Service A completes order-1; service B, same scope and key, sees none of it.
	res, err := serviceA.Begin(ctx, beginReq("a-1"))
	if err != nil || res.GetReserved() == nil {
		t.Fatalf("A Begin: %v %v", res, err)
	}
	epoch := res.GetReserved().GetEpoch()
	outcome, _ := anypb.New(&idemgatev1.ResolveResponse{})
	finish := &idemgatev1.FinishRequest{Scope: "/payments.v1.Payments/Charge", Key: "order-1", AttemptToken: "a-1", Epoch: epoch, Outcome: outcome}
	if _, err := serviceB.Finish(ctx, finish); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("B finishing A's reservation: %v, want refused", err)
	}
	if _, err := serviceB.Release(ctx, &idemgatev1.ReleaseRequest{Scope: finish.Scope, Key: finish.Key, AttemptToken: "a-1", Epoch: epoch}); err != nil {
		t.Fatalf("B releasing: %v, want a no-op success (nothing of B's is held)", err)
	}
	if _, err := serviceA.Finish(ctx, finish); err != nil {
		t.Fatalf("A Finish after B's attempts: %v", err)
	}
	resB, err := serviceB.Begin(ctx, beginReq("b-1"))
	if err != nil || resB.GetReserved() == nil {
		t.Fatalf("B Begin with A's key: %v %v, want B's own fresh reservation, never A's outcome", resB, err)
	}
	_, err = serviceB.Resolve(ctx, &idemgatev1.ResolveRequest{Scope: finish.Scope, Key: finish.Key, Resolution: &idemgatev1.ResolveRequest_Complete{Complete: outcome}})
	if status.Code(err) != codes.FailedPrecondition { // B's own live reservation, not A's record
		t.Fatalf("B Resolve: %v", err)
	}
	again, err := serviceA.Begin(ctx, beginReq("a-2"))
	if err != nil || again.GetCompleted() == nil {
		t.Fatalf("A's record after everything B did: %v %v, want A's outcome intact", again, err)
	}
}

func TestClientCertificateNamesTheCaller(t *testing.T) {
	t.Parallel()
	ca, caKey := newCA(t)
	serverCert := leaf(t, ca, caKey, "dedupe", nil, x509.ExtKeyUsageServerAuth)
	spiffe, _ := url.Parse("spiffe://example.org/payments")
	clientCert := leaf(t, ca, caKey, "payments-tool", []*url.URL{spiffe}, x509.ExtKeyUsageClientAuth)
	pool := x509.NewCertPool()
	pool.AddCert(ca)

	a, err := auth.New(auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	serverTLS := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS13})
	addr := startServer(t, a, grpc.Creds(serverTLS))

	withCert := client(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{clientCert}, ServerName: "dedupe", MinVersion: tls.VersionTLS13})))
	withoutCert := client(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "dedupe", MinVersion: tls.VersionTLS13})))
	ctx := context.Background()
	if res, err := withCert.Begin(ctx, beginReq("c-1")); err != nil || res.GetReserved() == nil {
		t.Fatalf("with a client certificate: %v %v", res, err)
	}
	if _, err := withoutCert.Begin(ctx, beginReq("c-2")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("TLS without a client certificate: %v, want UNAUTHENTICATED", err)
	}
}

func TestConfigAndTokenFile(t *testing.T) {
	t.Parallel()
	tokens, err := auth.ReadTokens(strings.NewReader("# tools\nservice-a client " + secretA + "\n\nops admin " + secretB + "\n"))
	if err != nil || len(tokens) != 2 || !tokens[1].Admin || tokens[0].Admin || tokens[0].Name != "service-a" {
		t.Fatalf("ReadTokens = %+v, %v", tokens, err)
	}
	if _, err := auth.ReadTokens(strings.NewReader("service-a superuser x\n")); err == nil {
		t.Fatal("a bad role was accepted")
	}
	for _, bad := range []auth.Config{
		{Tokens: []auth.Token{{Name: "a", Secret: "short"}}},
		{Tokens: []auth.Token{{Name: "", Secret: secretA}}},
		{Tokens: []auth.Token{{Name: "a\x1fb", Secret: secretA}}},
		{Tokens: []auth.Token{{Name: "a", Secret: secretA}, {Name: "b", Secret: secretA}}},
	} {
		if _, err := auth.New(bad); err == nil {
			t.Errorf("auth.New(%+v) accepted it", bad)
		}
	}
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key
}

func leaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, uris []*url.URL, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		URIs: uris, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

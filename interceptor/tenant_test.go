package interceptor_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"testing"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/idemgate/idemgate"
	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
	"github.com/idemgate/idemgate/interceptor"
)

// verifiedPeer is a call from a client whose certificate the transport
// verified, carrying a SPIFFE ID.
func verifiedPeer(spiffeID, key string) context.Context {
	id, _ := url.Parse(spiffeID)
	cert := &x509.Certificate{URIs: []*url.URL{id}}
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{
		State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}},
	}})
	return metadata.NewIncomingContext(ctx, metadata.Pairs(idemgate.KeyHeader, key))
}

// By default the tenant is the caller's verified identity: tenant A reusing
// tenant B's key gets its own execution, never B's response.
func TestTenantsFromVerifiedPeers(t *testing.T) {
	t.Parallel()
	h := setup(t)
	intercept := h.Gate.UnaryServerInterceptor()
	handler := func(ctx context.Context, req any) (any, error) {
		return h.svc.Mutate(ctx, req.(*testingv1.MutateRequest))
	}
	req := &testingv1.MutateRequest{Payload: "charge"}

	a, err := intercept(verifiedPeer("spiffe://example.org/agent-a", "order-1"), req, mutateInfo, handler)
	if err != nil {
		t.Fatal(err)
	}
	b, err := intercept(verifiedPeer("spiffe://example.org/agent-b", "order-1"), req, mutateInfo, handler)
	if err != nil {
		t.Fatal(err)
	}
	if a.(*testingv1.MutateResponse).GetExecution() == b.(*testingv1.MutateResponse).GetExecution() {
		t.Fatal("tenant B got tenant A's response for the same key")
	}
	again, err := intercept(verifiedPeer("spiffe://example.org/agent-a", "order-1"), req, mutateInfo, handler)
	if err != nil || again.(*testingv1.MutateResponse).GetExecution() != a.(*testingv1.MutateResponse).GetExecution() {
		t.Fatalf("tenant A's retry: %v %v, want A's own replay", again, err)
	}
	if h.svc.Executions() != 2 {
		t.Fatalf("%d executions, want one per tenant", h.svc.Executions())
	}
	if tenant, _ := interceptor.PeerTenant(context.Background()); tenant != "" {
		t.Fatalf("PeerTenant without a verified peer = %q, want the shared tenant", tenant)
	}
}

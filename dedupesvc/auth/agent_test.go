package auth_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// incoming is a server context with a bearer token and, when agent is not
// empty, a forwarded agent.
func incoming(secret, agent string) context.Context {
	md := metadata.Pairs("authorization", "Bearer "+secret)
	if agent != "" {
		md.Append(dedupesvc.AgentHeader, agent)
	}
	return metadata.NewIncomingContext(context.Background(), md)
}

// A forwarder's agent is taken, a name that could blur logs refused; any
// other caller's header is ignored.
func TestForwardedAgent(t *testing.T) {
	a, err := auth.New(auth.Config{Tokens: []auth.Token{{Name: "tools", Secret: secretA}, {Name: "payments", Secret: secretB}},
		Forwarders: []string{"tools"}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.Authenticate(incoming(secretA, "agent-7"))
	if err != nil || c.Name != "tools" || c.Agent != "agent-7" {
		t.Fatalf("forwarder: %+v, %v; want tools forwarding agent-7", c, err)
	}
	c, err = a.Authenticate(incoming(secretB, "agent-7"))
	if err != nil || c.Name != "payments" || c.Agent != "" {
		t.Fatalf("not a forwarder: %+v, %v; want payments, the header ignored", c, err)
	}
	for _, bad := range []string{"a\nb", strings.Repeat("x", dedupesvc.MaxAgentBytes+1), "\xff"} {
		_, err := a.Authenticate(incoming(secretA, bad))
		if status.Code(err) != codes.InvalidArgument || grpcerr.Reason(err) != dedupesvc.ReasonInvalidRequest {
			t.Errorf("agent %q: %v, want INVALID_ARGUMENT %s", bad, err, dedupesvc.ReasonInvalidRequest)
		}
	}
}

// Admit runs before a stream's message is read: a call without valid
// credentials is refused, a health check admitted unauthenticated.
func TestAdmit(t *testing.T) {
	a, err := auth.New(auth.Config{Tokens: []auth.Token{{Name: "tools", Secret: secretA}}})
	if err != nil {
		t.Fatal(err)
	}
	stranger := metadata.NewIncomingContext(context.Background(), metadata.MD{})
	if ok, err := a.Admit(incoming(secretA, ""), "/idemgate.v1.DedupeService/Begin"); !ok || err != nil {
		t.Errorf("valid token: %v, %v; want authenticated", ok, err)
	}
	if ok, err := a.Admit(stranger, "/grpc.health.v1.Health/Watch"); ok || err != nil {
		t.Errorf("health check without credentials: %v, %v; want admitted unauthenticated", ok, err)
	}
	if _, err := a.Admit(stranger, "/idemgate.v1.DedupeService/Begin"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Begin without credentials: %v, want UNAUTHENTICATED", err)
	}
	if _, err := a.Admit(incoming("not-a-valid-token-at-all", ""), "/idemgate.v1.DedupeService/Begin"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Begin with a bad token: %v, want UNAUTHENTICATED", err)
	}
}

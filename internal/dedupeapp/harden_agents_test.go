package dedupeapp_test

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/dedupeapp"
)

const toolsSecret = "tools-secret-0123456789abc"

// asAgent is ctx forwarding agent as a tool server's interceptor does.
func asAgent(ctx context.Context, agent string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, dedupesvc.AgentHeader, agent)
}

// A tool server allowed to forward its agents (-agent-forwarders) gets the
// Begin rate per agent: one agent over its rate, with calls the service
// refuses anyway, leaves its neighbours behind the same tool server their
// own. A caller not allowed to forward shares one rate whatever it sends.
func TestForwardedAgentsHaveTheirOwnRate(t *testing.T) {
	t.Parallel()
	tokens := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, tokens, "tools client "+toolsSecret+"\npayments client "+clientSecret+"\n")
	const burst = 5
	addr, _ := startLogged(t, dedupeapp.Config{TokenFile: tokens, AgentForwarders: []string{"tools"}, CallerBeginRate: 0.001, CallerBeginBurst: burst})

	beginAs := func(client idemgatev1.DedupeServiceClient, agent string, n int) error {
		_, err := client.Begin(asAgent(callCtx(t), agent), beginRequest(agent+"-"+strconv.Itoa(n)))
		return err
	}
	wantOverRate := func(who string, err error) {
		t.Helper()
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("%s over its rate: %v, want ResourceExhausted", who, err)
		}
	}

	tools := idemgatev1.NewDedupeServiceClient(dial(t, addr, withToken(toolsSecret)))
	for i := range burst {
		if err := beginAs(tools, "noisy-agent", i); err != nil {
			t.Fatal(err)
		}
	}
	wantOverRate("the noisy agent", beginAs(tools, "noisy-agent", burst))
	if err := beginAs(tools, "neighbour", 0); err != nil {
		t.Fatalf("the neighbour of an agent over its rate, behind the same tool server: %v, want served", err)
	}

	payments := idemgatev1.NewDedupeServiceClient(dial(t, addr, withToken(clientSecret)))
	for i := range burst {
		if err := beginAs(payments, "a", i); err != nil {
			t.Fatal(err)
		}
	}
	wantOverRate("a caller not allowed to forward, naming another agent", beginAs(payments, "b", 0))
}

// The Finish bucket follows the Begin bucket per forwarded agent: every
// Finish of a Begin the service let in passes, however many agents share
// the tool server. (Keyed by the tool server alone, the second agent's
// Finishes were refused for a rate its Begins never exceeded.)
func TestForwardedAgentsFinishWhatTheirBeginsReserved(t *testing.T) {
	t.Parallel()
	tokens := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, tokens, "tools client "+toolsSecret+"\n")
	const burst = 5
	addr, _ := startLogged(t, dedupeapp.Config{TokenFile: tokens, AgentForwarders: []string{"tools"}, CallerBeginRate: 0.001, CallerBeginBurst: burst})
	tools := idemgatev1.NewDedupeServiceClient(dial(t, addr, withToken(toolsSecret)))
	outcome, err := anypb.New(wrapperspb.String("done"))
	if err != nil {
		t.Fatal(err)
	}
	for _, agent := range []string{"agent-a", "agent-b", "agent-c"} {
		for i := range burst {
			req := beginRequest(agent + "-" + strconv.Itoa(i))
			res, err := tools.Begin(asAgent(callCtx(t), agent), req)
			if err != nil {
				t.Fatalf("%s Begin %d: %v", agent, i, err)
			}
			fin := &idemgatev1.FinishRequest{Scope: req.GetScope(), Key: req.GetKey(), AttemptToken: req.GetAttemptToken(),
				Epoch: res.GetReserved().GetEpoch(), Outcome: outcome}
			if _, err := tools.Finish(asAgent(callCtx(t), agent), fin); err != nil {
				t.Fatalf("%s Finish %d of a Begin let in: %v, want stored", agent, i, err)
			}
		}
	}
}

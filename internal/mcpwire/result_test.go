package mcpwire

import (
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"google.golang.org/grpc/codes"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// A key reused with other arguments is escalated, as the gRPC callers'
// table says: advice to mint a new key would have an agent loop run the
// side effect again.
func TestKeyReusedIsEscalated(t *testing.T) {
	if a := Advice(idemgate.ReasonKeyReused, codes.FailedPrecondition); a != AdviceEscalate {
		t.Errorf("advice for %s = %q, want %q", idemgate.ReasonKeyReused, a, AdviceEscalate)
	}
}

// The model reads an IDEMPOTENCY_OUTCOME_UNKNOWN refusal's text: it says
// plainly not to retry and to tell the user the action may or may not have
// happened and needs a person to check; the operator's detail stays in
// _meta's message.
func TestOutcomeUnknownTextIsForTheModel(t *testing.T) {
	res := ErrorResult(gatecore.OutcomeUnknown("order-7"))
	if !res.IsError || len(res.Content) != 1 {
		t.Fatalf("result = %+v", res)
	}
	text := res.Content[0].(*mcp.TextContent).Text
	for _, want := range []string{"IDEMPOTENCY_OUTCOME_UNKNOWN", "Do not retry this action", "Tell the user", "may or may not have happened", "a person", "(escalate)"} {
		if !strings.Contains(text, want) {
			t.Errorf("text %q lacks %q", text, want)
		}
	}
	for _, operator := range []string{"idemctl", "Resolve", "operator resolves the record"} {
		if strings.Contains(text, operator) {
			t.Errorf("text %q speaks to operators (%q)", text, operator)
		}
	}
	e, _ := res.Meta[MetaError].(map[string]any)
	if msg, _ := e["message"].(string); !strings.Contains(msg, "idemctl") || e["reason"] != idemgate.ReasonOutcomeUnknown || e["advice"] != AdviceEscalate {
		t.Errorf("_meta error = %+v, want the operator's message, the reason and advice escalate", e)
	}
}

// The model reads an IDEMPOTENCY_KEY_REUSED refusal's text: not the gRPC
// message's "use a new key", which would have an agent loop run an action
// that may be done already, but: nothing ran, do not take it again, ask the
// user before a new key.
func TestKeyReusedTextIsForTheModel(t *testing.T) {
	err := grpcerr.New(codes.FailedPrecondition, idemgate.ReasonKeyReused,
		"this idempotency key was first used with a different request; use a new key for a new action", nil, 0)
	res := ErrorResult(err)
	text := res.Content[0].(*mcp.TextContent).Text
	for _, want := range []string{"IDEMPOTENCY_KEY_REUSED", "nothing ran", "do not take it again", "ask the user", "(escalate)"} {
		if !strings.Contains(text, want) {
			t.Errorf("text %q lacks %q", text, want)
		}
	}
	if strings.Contains(text, "use a new key") {
		t.Errorf("text %q tells the model to use a new key", text)
	}
}

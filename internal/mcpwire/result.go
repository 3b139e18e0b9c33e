package mcpwire

import (
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// ErrorResult turns a status error into a tool error result: the model
// reads the text, a program reads _meta[MetaError]. The text is the code,
// the reason, ModelText and the advice; _meta's message is the status
// message as the tool server wrote it, for operators.
func ErrorResult(err error) *mcp.CallToolResult {
	st := status.Convert(err)
	e := map[string]any{
		"code":    CodeName(st.Code()),
		"message": st.Message(),
	}
	var reason string
	var retryAfter time.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.GetReason()
			e["reason"] = reason
			e["domain"] = d.GetDomain()
			if len(d.GetMetadata()) > 0 {
				e["metadata"] = d.GetMetadata()
			}
		case *errdetails.RetryInfo:
			retryAfter = d.GetRetryDelay().AsDuration()
			e["retryAfterSeconds"] = retryAfter.Seconds()
		}
	}
	text := CodeName(st.Code())
	if reason != "" {
		text += " " + reason
	}
	text += ": " + ModelText(reason, st.Message())
	if advice := Advice(reason, st.Code()); advice != "" {
		e["advice"] = advice
		text += " (" + advice
		if retryAfter > 0 {
			text += fmt.Sprintf(" after %s", retryAfter)
		}
		text += ")"
	}
	res := &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}
	res.SetMeta(mcp.Meta{MetaError: e})
	return res
}

// KeyMissingMessage is the message of an IDEMPOTENCY_KEY_MISSING refusal
// to an MCP client: it names the MCP carriers, the tool's key arguments
// first (what a model can set: a stock host sets no _meta) then
// _meta[MetaKey], never the gRPC metadata the tool server behind a bridge
// speaks of.
func KeyMissingMessage(keyArgs ...string) string {
	meta := "_meta[\"" + MetaKey + "\"]"
	var carriers string
	switch len(keyArgs) {
	case 0:
		carriers = meta
	case 1:
		carriers = "the argument " + keyArgs[0] + " (or " + meta + ")"
	default:
		carriers = "one of the arguments " + strings.Join(keyArgs, ", ") + " (or " + meta + ")"
	}
	return "this tool has side effects and needs an idempotency key: send one in " + carriers +
		", a fresh one for each action you intend, reused only to retry that same action"
}

// ReplaceMessage returns err with its status message replaced by message,
// its code and details (the ErrorInfo reason, domain and metadata, the
// RetryInfo) kept.
func ReplaceMessage(err error, message string) error {
	p := status.Convert(err).Proto()
	p.Message = message
	return status.FromProto(p).Err()
}

// OutcomeUnknownText is what the model reads of an
// IDEMPOTENCY_OUTCOME_UNKNOWN refusal, whatever the operator's message says.
const OutcomeUnknownText = "Do not retry this action, with this key or with a new one. " +
	"Tell the user that the action may or may not have happened, and that a person needs to check " +
	"what happened before it is tried again."

// KeyReusedText is what the model reads of an IDEMPOTENCY_KEY_REUSED
// refusal: the gRPC message's "use a new key for a new action" would have
// an agent loop mint a key and run an action that may already be done.
const KeyReusedText = "This idempotency key was already used with other arguments, so nothing ran. " +
	"If this is the action taken before with this key, it was already taken (it may be done, still running, or of unknown outcome): do not take it again. " +
	"If it is a different action, ask the user before taking it with a new key."

// ModelText is the part of an error result's text written for the model,
// for an error of the reason with the status message message: the message,
// except for reasons whose message is written for operators or for gRPC
// callers (IDEMPOTENCY_OUTCOME_UNKNOWN: OutcomeUnknownText;
// IDEMPOTENCY_KEY_REUSED: KeyReusedText).
func ModelText(reason, message string) string {
	switch reason {
	case idemgate.ReasonOutcomeUnknown:
		return OutcomeUnknownText
	case idemgate.ReasonKeyReused:
		return KeyReusedText
	}
	return message
}

// Advice values: what a caller does with an error, by its reason.
const (
	// AdviceRetrySameKey: retry the call with the same key (after the
	// RetryInfo delay when there is one); it gets the action's outcome
	// without running it twice.
	AdviceRetrySameKey = "retry_same_key"
	// AdviceFixRequest: the request is malformed (key missing or invalid,
	// arguments invalid); fix it and call again.
	AdviceFixRequest = "fix_request"
	// AdviceEscalate: nothing a retry can fix (the outcome is unknown, the
	// stored outcome cannot be returned, the key names another action); hand
	// it to a human or the reconciliation process. Never a new key: for a
	// reused key that would run the side effect again.
	AdviceEscalate = "escalate"
)

// Advice returns what a caller does with an error of the reason (and code,
// for errors without an idemgate reason): one of the Advice values, or ""
// when the error is the tool's own.
func Advice(reason string, code codes.Code) string {
	switch reason {
	case idemgate.ReasonInFlight, idemgate.ReasonStoreUnavailable, idemgate.ReasonQuotaExceeded, ReasonAnswerBudgetExhausted:
		return AdviceRetrySameKey
	case idemgate.ReasonKeyMissing, idemgate.ReasonKeyInvalid, idemgate.ReasonKeyConflict, ReasonArgumentsInvalid, ReasonArgumentsTooLarge, ReasonUnauthenticated:
		return AdviceFixRequest
	case idemgate.ReasonKeyReused, idemgate.ReasonOutcomeUnknown, idemgate.ReasonResultTooLarge, idemgate.ReasonStoreRejected, idemgate.ReasonOutcomeTypeMismatch, ReasonAnswerTooLarge:
		return AdviceEscalate
	}
	if reason == "" && (code == codes.Unavailable || code == codes.DeadlineExceeded) {
		// The tool server could not be reached or did not answer in time:
		// a gated call may have run, and the same key finds out.
		return AdviceRetrySameKey
	}
	return ""
}

// CodeName is a code's canonical name, as in google.rpc.Code
// ("FAILED_PRECONDITION", "CANCELLED"): grpcerr.CodeName, the one table
// every transport names codes by.
func CodeName(c codes.Code) string { return grpcerr.CodeName(c) }

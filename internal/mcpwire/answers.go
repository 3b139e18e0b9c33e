package mcpwire

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"

	"github.com/idemgate/idemgate/internal/grpcerr"
)

// ReasonAnswerBudgetExhausted is the ErrorInfo reason of a tool call that
// ran but whose answer the server did not hold: the answers it was writing
// over HTTP held HTTPLimits.MaxAnswerBytes, or MaxAnswerBytesPerIP for the
// caller's address (callers that do not read their answers).
// RESOURCE_EXHAUSTED with RetryInfo. The call ran: a retry with the same
// idempotency key replays its stored outcome without running it again (a
// call without a key, or to a tool that is not gated, runs again). The
// ErrorInfo metadata "size_bytes" gives the answer's size.
const ReasonAnswerBudgetExhausted = "MCP_ANSWER_BUDGET_EXHAUSTED"

// ReasonAnswerTooLarge is the ErrorInfo reason of a tool call that ran but
// whose answer is larger than the server holds for one caller
// (HTTPLimits.MaxAnswerBytesPerIP, or MaxAnswerBytes when lower), so it is
// never sent. RESOURCE_EXHAUSTED; a retry gets the same refusal. The
// ErrorInfo metadata "size_bytes" gives the answer's size, "limit_bytes"
// the limit.
const ReasonAnswerTooLarge = "MCP_ANSWER_TOO_LARGE"

// answerRetryAfter is the RetryInfo of ReasonAnswerBudgetExhausted, as the
// Retry-After of a body refused by the body budget.
const answerRetryAfter = time.Second

// answers is the answer budget of an HTTPMiddleware: the bytes of answers
// held at once, in all and by one client address.
type answers struct {
	budget *byteBudget
	limit  int64 // the largest answer it can ever hold
}

func newAnswers(l HTTPLimits) *answers {
	return &answers{budget: &byteBudget{left: l.MaxAnswerBytes, perIP: l.MaxAnswerBytesPerIP, held: map[string]int64{}}, limit: min(l.MaxAnswerBytes, l.MaxAnswerBytesPerIP)}
}

// answerKey is the context key of a request's *answerAccount.
type answerKey struct{}

// answerAccount is what the answers to one HTTP request hold of the budget,
// given back when the request is done: its response written, or its
// writing failed (a write timeout included).
type answerAccount struct {
	a      *answers
	client string
	// header is the request's, which the SDK hands each call it carries
	// (RequestExtra.Header): the account is that request's only.
	header http.Header
	mu     sync.Mutex
	held   int64
	done   bool
}

// account returns r with an account of client's in its context (HoldAnswers
// charges it), and the function that gives back what it holds, to call
// once r is done with: nothing it answers is held after.
func (a *answers) account(r *http.Request, client string) (*http.Request, func()) {
	acct := &answerAccount{a: a, client: client, header: r.Header}
	return r.WithContext(context.WithValue(r.Context(), answerKey{}, acct)), acct.close
}

// hold takes n from the budget; false when it does not fit. A request that
// is done takes nothing and holds everything: no response of its will
// write the answer (the SDK drops it).
func (acct *answerAccount) hold(n int64) bool {
	acct.mu.Lock()
	defer acct.mu.Unlock()
	if acct.done {
		return true
	}
	if !acct.a.budget.take(acct.client, n) {
		return false
	}
	acct.held += n
	return true
}

func (acct *answerAccount) close() {
	acct.mu.Lock()
	defer acct.mu.Unlock()
	acct.done = true
	acct.a.budget.give(acct.client, acct.held)
	acct.held = 0
}

// accountOf is the account of the HTTP request that req came in, nil when
// there is none: over stdio; over HTTP without HTTPMiddleware; or in a
// stateful session, whose calls run on the context of the request that
// opened it (the SDK's stateless handler serves each request's calls on
// that request's context, its values kept). The request is known by its
// Header, which the SDK hands every call it carries.
func accountOf(ctx context.Context, req mcp.Request) *answerAccount {
	acct, _ := ctx.Value(answerKey{}).(*answerAccount)
	if acct == nil || req == nil || req.GetExtra() == nil || !sameMap(acct.header, req.GetExtra().Header) {
		return nil
	}
	return acct
}

// sameMap reports whether a and b are one map.
func sameMap(a, b http.Header) bool {
	return a != nil && reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// holdAnswer charges an answer of n bytes to the answer budget of the
// HTTP request that req came in (accountOf), until that request is done.
// It returns nil when the answer fits, or when there is no such request;
// otherwise the error to answer instead (ReasonAnswerBudgetExhausted, or
// ReasonAnswerTooLarge for an answer no budget of one caller's holds), and
// nothing is held.
func holdAnswer(ctx context.Context, req mcp.Request, n int64) error {
	acct := accountOf(ctx, req)
	if acct == nil || n <= 0 || acct.hold(n) {
		return nil
	}
	meta := map[string]string{"size_bytes": strconv.FormatInt(n, 10)}
	if n > acct.a.limit {
		meta["limit_bytes"] = strconv.FormatInt(acct.a.limit, 10)
		return grpcerr.New(codes.ResourceExhausted, ReasonAnswerTooLarge,
			fmt.Sprintf("the tool call ran, but its answer (%d bytes) is larger than this server holds for one caller (%d bytes), so it was not sent; "+
				"a retry gets the same refusal: the server's operator can raise the limit (-max-answer-bytes-per-ip)", n, acct.a.limit), meta, 0)
	}
	return grpcerr.New(codes.ResourceExhausted, ReasonAnswerBudgetExhausted,
		fmt.Sprintf("the tool call ran, but this server already holds as many answers as it writes at once, for your address or in all, so its answer (%d bytes) was not sent; "+
			"retry with the same idempotency key to get the stored outcome without running the call again (a call without a key runs again)", n), meta, answerRetryAfter)
}

// HoldAnswers is receiving middleware that holds each tools/call result
// within the answer budget of the HTTP request it answers (HTTPMiddleware's
// HTTPLimits.MaxAnswerBytes and MaxAnswerBytesPerIP), by its AnswerSize,
// until that request's response is written or its writing fails: a result
// that does not fit is dropped, and the call is answered
// ReasonAnswerBudgetExhausted (ReasonAnswerTooLarge for a result larger
// than one caller may hold) instead, as an ErrorResult. The budget holds
// over a stateless streamable HTTP handler inside HTTPMiddleware (as
// HTTPHandler's); over stdio, over HTTP without HTTPMiddleware, and in a
// stateful session (whose calls the SDK runs on the context of the request
// that opened it), every result passes. Every other method's result
// passes.
func HoldAnswers(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if err != nil || res == nil || method != "tools/call" {
			return res, err
		}
		if err := holdAnswer(ctx, req, AnswerSize(res)); err != nil {
			return ErrorResult(err), nil
		}
		return res, nil
	}
}

// AnswerSize is the size HoldAnswers counts for a tools/call result: what a
// result with an AnswerSize() int64 method reports (the bridge's and
// mcpgate's stored results: their encoding's exact size); for a
// *mcp.CallToolResult, the bytes of its content's text and data (base64)
// and of its structuredContent (a json.RawMessage's length; any other value
// counted as large as the text, which the SDK's typed tools fill with the
// same JSON): what makes an answer large, without encoding it. 0 for any
// other result.
func AnswerSize(res mcp.Result) int64 {
	if s, ok := res.(interface{ AnswerSize() int64 }); ok {
		return s.AnswerSize()
	}
	r, ok := res.(*mcp.CallToolResult)
	if !ok || r == nil {
		return 0
	}
	var n, text int64
	for _, c := range r.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			text += int64(len(c.Text))
		case *mcp.ImageContent:
			n += int64(base64.StdEncoding.EncodedLen(len(c.Data)))
		case *mcp.AudioContent:
			n += int64(base64.StdEncoding.EncodedLen(len(c.Data)))
		case *mcp.EmbeddedResource:
			if c.Resource != nil {
				n += int64(len(c.Resource.Text) + base64.StdEncoding.EncodedLen(len(c.Resource.Blob)))
			}
		}
	}
	n += text
	switch s := r.StructuredContent.(type) {
	case nil:
	case json.RawMessage:
		n += int64(len(s))
	default:
		n += text
	}
	return n
}

// AnswerSize of a result MarkComplete wrapped is its own.
func (r completeResult) AnswerSize() int64 { return AnswerSize(r.Result) }

// Command mcp-go-agent is an agent loop, written with the official Go MCP
// SDK's client, that calls the native MCP server gated by mcpgate
// (examples/mcp-server): charge_card, gated, and get_balance, a read.
//
// The orchestration layer, not the model, owns the idempotency key, and
// which key covers which retry depends on who retries:
//
//   - A retry of ONE tool call below the model (the answer was lost, a
//     timeout, a framework retry, an MCP client re-issuing a request whose
//     stream broke) resends that call as it was: same tool-call id (OpenAI's
//     tool_call.id, Anthropic's tool_use.id), same key, and the tool runs
//     once.
//   - The model calling again (unsure whether the charge went through) is a
//     NEW tool call: real model APIs give it a new id, so a key made from the
//     tool-call id would be new too, and the card would be charged twice.
//     This runtime keys each charge by the action it decided before the
//     model ran: the order. charge_card's input schema marks its orderId
//     argument as the key ("io.idemgate/idempotency-key": true; mcpgate
//     keeps records per tool, so the order id alone names "this order's
//     charge"). The runtime reads that mark from tools/list and sends, as
//     the key, the id of an order it decided to charge. The model fills
//     orderId too, but a key the model supplies is advisory: a call naming
//     an order the runtime did not decide to charge is never sent, since a
//     fresh id there would be a fresh key and a second charge.
//
// The simulated model gives every tool call a fresh id, as real APIs do.
//
//	go run ./examples/mcp-go-agent -http http://127.0.0.1:8081/mcp                   # after make run and make run-mcp-server
//	go run ./examples/mcp-go-agent -- go run ./examples/mcp-server -data-dir /tmp/d  # stdio: the agent starts the server
//
// It prints one JSON line per tool call (what happened, the tool-call id,
// the key, whether the answer was a replay, a refusal's reason and advice),
// plus one "explain" line saying what a tool-call-id key would have done,
// and exits 0.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// What the server puts on the wire (mcpgate's MetaReplayed, MetaError and
// SchemaKey), spelled out so that a client needs no server package.
const (
	metaReplayed = "io.idemgate/replayed"
	metaError    = "io.idemgate/error"
	schemaKey    = "io.idemgate/idempotency-key"

	chargeTool  = "charge_card"
	balanceTool = "get_balance"

	adviceRetrySameKey = "retry_same_key"
)

func main() {
	endpoint := flag.String("http", "", "the server's streamable HTTP `endpoint`; without it, the arguments after the flags are the server command, spoken to over stdio")
	conversation := flag.String("conversation", "conv-1", "the conversation (agent run) `id`, for the explain line")
	customer := flag.String("customer", "cust_go", "the `customer` whose orders this run pays")
	orders := flag.String("orders", "", "the orders this run pays, as `id:cents,...` (default: two new ones, 4200 and 1500 cents)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: mcp-go-agent [flags] (-http URL | [--] server-command [args...])\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	plan, err := parsePlan(*customer, *orders)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcp-go-agent:", err)
		os.Exit(2)
	}
	if (*endpoint == "") == (flag.NArg() == 0) {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *endpoint, flag.Args(), *conversation, plan); err != nil {
		fmt.Fprintln(os.Stderr, "mcp-go-agent:", err)
		os.Exit(1)
	}
}

// order is one order the orchestration decided to pay.
type order struct {
	id          string
	amountCents int64
}

// plan is what the orchestration decided before the model ran: charge each
// of a customer's orders once.
type plan struct {
	customer string
	orders   []order
}

func parsePlan(customer, orders string) (plan, error) {
	p := plan{customer: customer}
	if orders == "" {
		return plan{customer: customer, orders: []order{{"ord_" + newID(), 4200}, {"ord_" + newID(), 1500}}}, nil
	}
	for _, o := range strings.Split(orders, ",") {
		id, cents, ok := strings.Cut(o, ":")
		n, err := strconv.ParseInt(cents, 10, 64)
		if !ok || id == "" || err != nil || n <= 0 {
			return plan{}, fmt.Errorf("-orders: %q is not id:cents", o)
		}
		p.orders = append(p.orders, order{id, n})
	}
	if len(p.orders) < 2 {
		return plan{}, errors.New("-orders: give at least two orders")
	}
	return p, nil
}

func newID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // never fails
	return hex.EncodeToString(b)
}

// toolCall is one tool call a model emitted.
type toolCall struct {
	ID        string
	Name      string
	Arguments map[string]any
}

// model stands in for a model API: every tool call it emits gets a new id,
// as OpenAI's and Anthropic's do, even when it repeats a call it made before.
type model struct{}

func (model) emit(name string, args map[string]any) toolCall {
	return toolCall{ID: "call_" + newID(), Name: name, Arguments: args}
}

// runtime is the orchestration layer: it runs the model's tool calls, keyed
// by the actions it decided.
type runtime struct {
	session *mcp.ClientSession
	// keyArg is charge_card's key argument, from its input schema.
	keyArg string
	// decided are the orders the runtime decided to charge, by id.
	decided map[string]order
}

// actionKey returns the key of the charge a tool call belongs to: the id of
// an order the runtime decided to charge, named by the call's key argument;
// false when it names none.
func (r *runtime) actionKey(tc toolCall) (string, bool) {
	id, _ := tc.Arguments[r.keyArg].(string)
	o, ok := r.decided[id]
	return o.id, ok
}

// line is what the agent prints for one tool call.
type line struct {
	ToolCallID string `json:"toolCallId"`
	Tool       string `json:"tool"`
	Key        string `json:"key,omitempty"`
	// Arguments are the arguments sent (the model's, with the runtime's key).
	Arguments map[string]any `json:"arguments,omitempty"`
	// Sent is false when the runtime refused the call itself.
	Sent       bool   `json:"sent"`
	Attempts   int    `json:"attempts"`
	Note       string `json:"note"`
	IsError    bool   `json:"isError"`
	Reason     string `json:"reason,omitempty"`
	Advice     string `json:"advice,omitempty"`
	Replayed   bool   `json:"replayed"`
	Structured any    `json:"structured,omitempty"`
	Text       string `json:"text,omitempty"`
}

// call runs one tool call, retrying it by the refusal's advice: every retry
// resends the same call, with the same tool-call id and the same key.
func (r *runtime) call(ctx context.Context, tc toolCall, note string) (line, error) {
	l := line{ToolCallID: tc.ID, Tool: tc.Name, Note: note}
	args := maps.Clone(tc.Arguments)
	if tc.Name == chargeTool {
		key, ok := r.actionKey(tc)
		if !ok {
			// What the runtime answers the model: nothing was charged.
			l.IsError = true
			l.Text = fmt.Sprintf("not sent: %s %v names no order this run decided to charge", r.keyArg, tc.Arguments[r.keyArg])
			return l, nil
		}
		l.Key = key
		args[r.keyArg] = key // the runtime's key, never one the model made up
	}
	l.Sent, l.Arguments = true, args
	const maxAttempts = 5
	for l.Attempts = 1; ; l.Attempts++ {
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		res, err := r.session.CallTool(callCtx, &mcp.CallToolParams{Name: tc.Name, Arguments: args})
		cancel()
		if err != nil {
			return l, fmt.Errorf("%s: %w", tc.Name, err)
		}
		l.IsError, l.Structured, l.Text = res.IsError, res.StructuredContent, textOf(res)
		l.Replayed, _ = res.Meta[metaReplayed].(bool)
		refusal, _ := res.Meta[metaError].(map[string]any)
		l.Reason, _ = refusal["reason"].(string)
		l.Advice, _ = refusal["advice"].(string)
		if !res.IsError || l.Advice != adviceRetrySameKey || l.Attempts == maxAttempts {
			// Done, or a refusal no retry fixes. escalate
			// (IDEMPOTENCY_OUTCOME_UNKNOWN, IDEMPOTENCY_KEY_REUSED, ...): a
			// human or a reconciler decides; retrying cannot tell what
			// happened, and a reused key means the calls under it differ,
			// which a new key would turn into a second charge. fix_request:
			// the call itself is wrong.
			return l, nil
		}
		// IDEMPOTENCY_IN_FLIGHT, IDEMPOTENCY_STORE_UNAVAILABLE, a quota: the
		// same key gets the action's outcome, never a second run.
		delay := 200 * time.Millisecond
		if s, ok := refusal["retryAfterSeconds"].(float64); ok {
			delay = time.Duration(s * float64(time.Second))
		}
		select {
		case <-ctx.Done():
			return l, ctx.Err()
		case <-time.After(delay):
		}
	}
}

func textOf(res *mcp.CallToolResult) string {
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			return t.Text
		}
	}
	return ""
}

// keyArgument returns the property of the tool's input schema marked as the
// idempotency key.
func keyArgument(tool *mcp.Tool) (string, error) {
	schema, _ := tool.InputSchema.(map[string]any)
	props, _ := schema["properties"].(map[string]any)
	for _, name := range slices.Sorted(maps.Keys(props)) {
		if p, _ := props[name].(map[string]any); p[schemaKey] == true {
			return name, nil
		}
	}
	return "", fmt.Errorf("%s marks no argument %q in its input schema; this agent is written for examples/mcp-server", tool.Name, schemaKey)
}

func run(ctx context.Context, endpoint string, command []string, conversation string, p plan) error {
	var transport mcp.Transport
	if endpoint != "" {
		transport = &mcp.StreamableClientTransport{Endpoint: endpoint}
	} else {
		cmd := exec.CommandContext(ctx, command[0], command[1:]...)
		cmd.Stderr = os.Stderr
		transport = &mcp.CommandTransport{Command: cmd}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-agent", Version: "1.0.0"}, nil)
	session, err := client.Connect(ctx, transport, nil)
	if err != nil {
		return err
	}
	defer session.Close()

	r := &runtime{session: session, decided: map[string]order{}}
	for tool, err := range session.Tools(ctx, nil) {
		if err != nil {
			return err
		}
		if tool.Name == chargeTool {
			if r.keyArg, err = keyArgument(tool); err != nil {
				return err
			}
		}
	}
	if r.keyArg == "" {
		return fmt.Errorf("the server has no tool %s", chargeTool)
	}
	for _, o := range p.orders {
		r.decided[o.id] = o
	}
	out := json.NewEncoder(os.Stdout)
	init := session.InitializeResult()
	if err := out.Encode(map[string]any{"protocolVersion": init.ProtocolVersion, "capabilities": init.Capabilities, "keyArgument": r.keyArg}); err != nil {
		return err
	}
	step := func(tc toolCall, note string) (line, error) {
		l, err := r.call(ctx, tc, note)
		if err != nil {
			return l, err
		}
		return l, out.Encode(l)
	}
	var m model
	first, rest := p.orders[0], p.orders[1:]
	chargeArgs := func(amountCents int64, orderID, note string) map[string]any {
		return map[string]any{"customerId": p.customer, "amountCents": amountCents, r.keyArg: orderID, "note": note}
	}

	// The model's first turn: charge the first order. The answer is lost on
	// the way back (simulated: dropped), so the runtime retries the SAME tool
	// call: same tool-call id, same key; the tool replays.
	charge := m.emit(chargeTool, chargeArgs(first.amountCents, first.id, "first order"))
	if _, err := step(charge, "answer lost"); err != nil {
		return err
	}
	if _, err := step(charge, "runtime retry: same tool call"); err != nil {
		return err
	}

	// The model, unsure the charge went through, calls again: a NEW tool
	// call with a new id (and another note, which is not part of the action:
	// the schema leaves it out of the fingerprint). The runtime keys it by
	// the order, so the key is the same and the answer the first charge's
	// replay: one charge.
	again := m.emit(chargeTool, chargeArgs(first.amountCents, first.id, "again: no confirmation seen"))
	if _, err := step(again, "model re-emits: new tool-call id"); err != nil {
		return err
	}
	toolCallIDKey := conversation + "/" + again.ID
	if err := out.Encode(map[string]string{
		"explain": "keyed by the tool-call id, the re-emitted call would have carried " + toolCallIDKey +
			", a key the tool server had never seen, and the card would have been charged a second time; " +
			"keyed by the action it carried " + first.id + " and got the first charge's replay",
		"toolCallIdKey": toolCallIDKey,
		"actionKey":     first.id,
	}); err != nil {
		return err
	}

	// The other orders: other actions, other keys, one charge each.
	for _, o := range rest {
		if _, err := step(m.emit(chargeTool, chargeArgs(o.amountCents, o.id, "next order")), "another order"); err != nil {
			return err
		}
	}

	// The model re-emits the first charge with an order id it made up: the
	// runtime decided no such order, so it sends nothing (passed on, the
	// fresh id would have been a fresh key and a second charge).
	madeUp := m.emit(chargeTool, chargeArgs(first.amountCents, first.id+"-retry", "retry"))
	if _, err := step(madeUp, "model makes up an order id"); err != nil {
		return err
	}

	// The model calls the first order's charge with another amount: the
	// action's key with other arguments is refused (IDEMPOTENCY_KEY_REUSED,
	// advice escalate); nothing is charged, and a person decides.
	wrong := m.emit(chargeTool, chargeArgs(first.amountCents+5700, first.id, "first order"))
	if _, err := step(wrong, "model re-emits with another amount"); err != nil {
		return err
	}

	// A read needs no key.
	_, err = step(m.emit(balanceTool, map[string]any{"customerId": p.customer}), "")
	return err
}

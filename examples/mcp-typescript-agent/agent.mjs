// An agent loop that calls gated tools through idemgate-mcp with the
// official TypeScript MCP SDK's Client (@modelcontextprotocol/sdk).
//
// The orchestration layer, not the model, owns the idempotency key, sent in
// _meta["io.idemgate/idempotency-key"], and which key covers which retry
// depends on who retries:
//
// - A retry of ONE tool call below the model (the answer was lost, a
//   timeout, a framework retry, an MCP client re-issuing a request whose
//   stream broke) resends that call: same tool-call id (OpenAI's
//   tool_call.id, Anthropic's tool_use.id), same key, and the tool runs once.
// - The model calling again (unsure whether the charge went through) is a
//   NEW tool call: real model APIs give it a new id. A key made from the
//   tool-call id would be new too, and the card would be charged twice. So
//   this runtime keys each side effect by the action it decided before the
//   model ran: "order/<order id>/charge", "order/<order id>/receipt". The
//   model's second call gets the same key and the first charge's replay.
//
// The simulated model below gives every tool call a fresh id, as real APIs do.
//
//   npm ci
//   node agent.mjs --stdio idemgate-mcp -target 127.0.0.1:50052 -plaintext
//   node agent.mjs --http http://127.0.0.1:8080/mcp
//
// It prints one JSON line per tool call (what happened, the tool-call id, the
// key, whether the answer was a replay, a refusal's reason and advice), plus
// one "explain" line saying what a tool-call-id key would have done, and
// exits 0.
import { randomBytes } from "node:crypto";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const META_KEY = "io.idemgate/idempotency-key";
const CHARGE = "examples.payments.v1.PaymentsService.ChargeCard";
const RECEIPT = "examples.payments.v1.PaymentsService.SendReceipt";
const BALANCE = "examples.payments.v1.PaymentsService.GetBalance";

function parseArgs(argv) {
  const opts = { conversation: "conv-1", customer: "cust_ts", order: `ord_${randomBytes(4).toString("hex")}` };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--stdio") {
      opts.stdio = argv.slice(i + 1);
      break;
    } else if (a === "--http") opts.http = argv[++i];
    else if (a === "--conversation") opts.conversation = argv[++i];
    else if (a === "--order") opts.order = argv[++i];
    else if (a === "--customer") opts.customer = argv[++i];
    else throw new Error(`unknown flag ${a}`);
  }
  if (!opts.stdio === !opts.http) throw new Error("give one of --http and --stdio");
  return opts;
}

const errorOf = (result) => result._meta?.["io.idemgate/error"] ?? {};
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// model stands in for a model API: every tool call it emits gets a new id,
// as OpenAI's and Anthropic's do, even when it repeats a call it made before.
const model = {
  emit: (name, args) => ({ id: `call_${randomBytes(6).toString("hex")}`, name, arguments: args }),
};

// Runtime is the orchestration layer. It decided the actions before the
// model ran (this conversation pays one order: charge it, then send its
// receipt) and keys every side effect by that action, never by the tool-call
// id: every call the model makes for the order's charge, whatever its id,
// carries "order/<order id>/charge".
class Runtime {
  constructor(client, order) {
    this.client = client;
    this.actionKeys = { [CHARGE]: `order/${order}/charge`, [RECEIPT]: `order/${order}/receipt` };
  }

  // keyFor returns the key of the action the tool call belongs to; null for
  // a read.
  keyFor(toolCall) {
    return this.actionKeys[toolCall.name] ?? null;
  }

  // run runs one tool call, retrying it by the refusal's advice. Every retry
  // resends the same call: same tool-call id, same key.
  async run(toolCall, maxAttempts = 5) {
    const key = this.keyFor(toolCall);
    const params = { name: toolCall.name, arguments: toolCall.arguments };
    if (key) params._meta = { [META_KEY]: key };
    let result;
    for (let attempt = 1; attempt <= maxAttempts; attempt++) {
      result = await this.client.callTool(params);
      const err = errorOf(result);
      if (!result.isError) return { key, attempt, result };
      if (err.advice === "retry_same_key") {
        // IDEMPOTENCY_IN_FLIGHT, IDEMPOTENCY_STORE_UNAVAILABLE, a quota: the
        // same key gets the action's outcome, never a second run.
        await sleep(1000 * (err.retryAfterSeconds ?? 0.2));
        continue;
      }
      // escalate (IDEMPOTENCY_OUTCOME_UNKNOWN, IDEMPOTENCY_KEY_REUSED, ...): a
      // human or a reconciler decides; retrying cannot tell what happened,
      // and a reused key means the calls under it differ, which a new key
      // would turn into a second side effect.
      // fix_request: the call itself is wrong.
      return { key, attempt, result };
    }
    return { key, attempt: maxAttempts, result };
  }
}

function report(toolCall, { key, attempt, result }, note = "") {
  const err = errorOf(result);
  console.log(JSON.stringify({
    toolCallId: toolCall.id,
    tool: toolCall.name.split(".").pop(),
    key,
    attempts: attempt,
    note,
    isError: Boolean(result.isError),
    reason: err.reason ?? null,
    advice: err.advice ?? null,
    replayed: result._meta?.["io.idemgate/replayed"] ?? null,
    structured: result.structuredContent ?? null,
    text: result.content?.find((c) => c.type === "text")?.text ?? null,
  }));
}

const opts = parseArgs(process.argv.slice(2));
const transport = opts.http
  ? new StreamableHTTPClientTransport(new URL(opts.http))
  : new StdioClientTransport({ command: opts.stdio[0], args: opts.stdio.slice(1), stderr: "inherit" });
const client = new Client({ name: "typescript-sdk-agent", version: "1.0.0" });
await client.connect(transport);
console.log(JSON.stringify({ capabilities: client.getServerCapabilities() }));
const runtime = new Runtime(client, opts.order);

// The model's first turn: charge the order. The answer is lost on the way
// back (simulated: dropped), so the runtime retries the SAME tool call: same
// tool-call id, same key; the tool replays.
const charge = model.emit(CHARGE, { customerId: opts.customer, amountCents: 4200 });
report(charge, await runtime.run(charge), "answer lost");
const retried = await runtime.run(charge);
report(charge, retried, "runtime retry: same tool call");
const chargeId = retried.result.structuredContent.chargeId;

// The model, unsure the charge went through, calls again: a NEW tool call
// with a new id. The runtime keys it by the action (this order's charge), so
// the key is the same and the answer is the first charge's replay: one charge.
const again = model.emit(CHARGE, { customerId: opts.customer, amountCents: 4200 });
report(again, await runtime.run(again), "model re-emits: new tool-call id");
const toolCallIdKey = `${opts.conversation}/${again.id}`;
console.log(JSON.stringify({
  explain: `keyed by the tool-call id, the re-emitted call would have carried ${toolCallIdKey}, ` +
    "a key the tool server had never seen, and the card would have been charged a second time; " +
    `keyed by the action it carried ${runtime.keyFor(again)} and got the first charge's replay`,
  toolCallIdKey,
  actionKey: runtime.keyFor(again),
}));

// Next turn: the order's receipt, another action, another key.
const receipt = model.emit(RECEIPT, { customerId: opts.customer, chargeId });
report(receipt, await runtime.run(receipt));

// The model calls the order's charge again with another amount: the
// action's key with other arguments is refused (IDEMPOTENCY_KEY_REUSED,
// advice escalate); nothing is charged, and a person decides.
const wrong = model.emit(CHARGE, { customerId: opts.customer, amountCents: 9900 });
report(wrong, await runtime.run(wrong), "model re-emits with another amount");

// A read needs no key.
const balance = model.emit(BALANCE, { customerId: opts.customer });
report(balance, await runtime.run(balance));
await client.close();

// An agent loop that calls gated tools through idemgate-mcp with the
// official TypeScript MCP SDK's Client (@modelcontextprotocol/sdk).
//
// The orchestration layer, not the model, owns the idempotency key: each
// tool call the model emits has an id (OpenAI's tool_call.id, Anthropic's
// tool_use.id), stable for that call, so the key is
// "<conversation>/<tool call id>", sent in _meta["io.idemgate/idempotency-key"].
// Every retry of that call -- after a lost answer, a timeout, or the model
// emitting the same call again -- reuses it, and the tool runs once.
//
//   npm ci
//   node agent.mjs --stdio idemgate-mcp -target 127.0.0.1:50052 -plaintext
//   node agent.mjs --http http://127.0.0.1:8080/mcp
//
// It prints one JSON line per tool call (the key, whether the answer was a
// replay, the refusal's reason and advice) and exits 0.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const META_KEY = "io.idemgate/idempotency-key";
const CHARGE = "examples.payments.v1.PaymentsService.ChargeCard";
const RECEIPT = "examples.payments.v1.PaymentsService.SendReceipt";
const BALANCE = "examples.payments.v1.PaymentsService.GetBalance";

function parseArgs(argv) {
  const opts = { conversation: "conv-1", customer: "cust_ts" };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--stdio") {
      opts.stdio = argv.slice(i + 1);
      break;
    } else if (a === "--http") opts.http = argv[++i];
    else if (a === "--conversation") opts.conversation = argv[++i];
    else if (a === "--customer") opts.customer = argv[++i];
    else throw new Error(`unknown flag ${a}`);
  }
  if (!opts.stdio === !opts.http) throw new Error("give one of --http and --stdio");
  return opts;
}

const errorOf = (result) => result._meta?.["io.idemgate/error"] ?? {};
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// callAction runs one tool call the model emitted as one logical action: the
// key is minted from the tool call's id and every retry reuses it. What the
// caller does with a refusal depends on its reason (the bridge's advice).
async function callAction(client, conversation, toolCall, maxAttempts = 5) {
  const key = `${conversation}/${toolCall.id}`;
  let result;
  for (let attempt = 1; attempt <= maxAttempts; attempt++) {
    result = await client.callTool({ name: toolCall.name, arguments: toolCall.arguments, _meta: { [META_KEY]: key } });
    const err = errorOf(result);
    if (!result.isError) return { key, attempt, result };
    if (err.advice === "retry_same_key") {
      // IDEMPOTENCY_IN_FLIGHT, IDEMPOTENCY_STORE_UNAVAILABLE, a quota: the
      // same key gets the action's outcome, never a second run.
      await sleep(1000 * (err.retryAfterSeconds ?? 0.2));
      continue;
    }
    // escalate (IDEMPOTENCY_OUTCOME_UNKNOWN, IDEMPOTENCY_KEY_REUSED, ...): a
    // human or a reconciler decides; retrying cannot tell what happened, and
    // a reused key is a bug in the orchestration, which a new key would turn
    // into a second side effect.
    // fix_request: the call itself is wrong.
    return { key, attempt, result };
  }
  return { key, attempt: maxAttempts, result };
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
  }));
}

const opts = parseArgs(process.argv.slice(2));
const transport = opts.http
  ? new StreamableHTTPClientTransport(new URL(opts.http))
  : new StdioClientTransport({ command: opts.stdio[0], args: opts.stdio.slice(1), stderr: "inherit" });
const client = new Client({ name: "typescript-sdk-agent", version: "1.0.0" });
await client.connect(transport);
console.log(JSON.stringify({ capabilities: client.getServerCapabilities() }));

// The model's first turn: charge the order. The answer is lost on the way
// back (simulated: dropped), so the runtime retries the same tool call.
const charge = { id: "call_7QXf2", name: CHARGE, arguments: { customerId: opts.customer, amountCents: 4200 } };
report(charge, await callAction(client, opts.conversation, charge), "answer lost");
const retried = await callAction(client, opts.conversation, charge);
report(charge, retried, "runtime retry");
const chargeId = retried.result.structuredContent.chargeId;

// The model, unsure, emits the same tool call again: same id, same key.
report(charge, await callAction(client, opts.conversation, charge), "model re-emits");

// Next turn: a receipt, a new tool call, a new key.
const receipt = { id: "call_Hk3p9", name: RECEIPT, arguments: { customerId: opts.customer, chargeId } };
report(receipt, await callAction(client, opts.conversation, receipt));

// A bug in the orchestration: a new action (another amount) under the
// charge's key is refused with IDEMPOTENCY_KEY_REUSED, advice escalate.
const wrong = { ...charge, arguments: { customerId: opts.customer, amountCents: 9900 } };
report(wrong, await callAction(client, opts.conversation, wrong), "key reused for another action");

// A read needs no key.
const balance = { id: "call_b4L", name: BALANCE, arguments: { customerId: opts.customer } };
report(balance, { key: null, attempt: 1, result: await client.callTool({ name: BALANCE, arguments: balance.arguments }) });
await client.close();

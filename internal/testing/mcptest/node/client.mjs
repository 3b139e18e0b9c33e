// The official TypeScript MCP SDK's Client against idemgate-mcp, for
// internal/testing/mcptest (go test). It runs one scripted sequence of calls and
// prints what the SDK returned, as one JSON object on stdout; the Go test
// asserts on it.
//
//   node client.mjs stdio <bridge binary> <bridge flags...>
//   node client.mjs http <endpoint URL>
//
// Each run uses its own keys and customer, given by MCPTEST_RUN. The tools
// are the bridge's payments tools unless MCPTEST_CHARGE_TOOL and
// MCPTEST_BALANCE_TOOL name others with the same arguments (the native
// mcpgate example server's).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [mode, ...rest] = process.argv.slice(2);
const run = process.env.MCPTEST_RUN ?? "ts";
const charge = process.env.MCPTEST_CHARGE_TOOL ?? "examples.payments.v1.PaymentsService.ChargeCard";
const balance = process.env.MCPTEST_BALANCE_TOOL ?? "examples.payments.v1.PaymentsService.GetBalance";
const metaKey = "io.idemgate/idempotency-key";

let transport;
if (mode === "stdio") {
  transport = new StdioClientTransport({ command: rest[0], args: rest.slice(1), stderr: "inherit" });
} else if (mode === "http") {
  transport = new StreamableHTTPClientTransport(new URL(rest[0]));
} else {
  console.error("usage: node client.mjs stdio <bin> <flags...> | http <url>");
  process.exit(2);
}

// The version the initialize handshake settled on, as the SDK hands it to
// the transport (over stdio too, where the transport has no use for it).
let protocolVersion;
const setProtocolVersion = transport.setProtocolVersion?.bind(transport);
transport.setProtocolVersion = (v) => {
  protocolVersion = v;
  setProtocolVersion?.(v);
};

const client = new Client({ name: "mcptest-ts", version: "1.0.0" });
await client.connect(transport);

const customer = `cust_ts_${run}`;
const chargeWith = (key, amountCents, extra = {}) =>
  client.callTool({
    name: charge,
    arguments: { customerId: customer, amountCents },
    ...(key ? { _meta: { [metaKey]: key } } : {}),
    ...extra,
  });

const out = {};
out.protocolVersion = protocolVersion;
out.capabilities = client.getServerCapabilities();
out.tools = (await client.listTools()).tools;
out.first = await chargeWith(`order-1-${run}`, 4200);
out.second = await chargeWith(`order-1-${run}`, 4200);
out.concurrent = await Promise.all(Array.from({ length: 6 }, () => chargeWith(`order-2-${run}`, 700)));
out.reuse = await chargeWith(`order-1-${run}`, 9900);
out.keyless = await chargeWith("", 100);
// SEP-3182's carrier: a tools/call parameter next to name and arguments.
out.sepFirst = await chargeWith("", 300, { idempotencyKey: `order-3-${run}` });
out.sepSecond = await chargeWith("", 300, { idempotencyKey: `order-3-${run}` });
out.balance = await client.callTool({ name: balance, arguments: { customerId: customer } });

await client.close();
process.stdout.write(JSON.stringify(out) + "\n");

// The official TypeScript MCP SDK v2 client (@modelcontextprotocol/client),
// pinned to protocol version 2026-07-28, against idemgate-mcp or the native
// mcpgate example server, for internal/testing/mcptest (go test). Pinned, the
// client connects with server/discover and no initialize, and fails rather
// than fall back to an earlier version. It runs one scripted sequence of
// calls and prints what the SDK returned, as one JSON object on stdout; the
// Go test asserts on it.
//
//   node client2026.mjs stdio <server binary> <server flags...>
//   node client2026.mjs http <endpoint URL>
//
// Over HTTP it also prints the raw JSON-RPC response of every tools/call as
// it came off the wire (wire), so the Go test compares bytes. Each run uses
// its own keys and customer, given by MCPTEST_RUN. The tools are the
// bridge's payments tools unless MCPTEST_CHARGE_TOOL and MCPTEST_BALANCE_TOOL
// name others with the same arguments (the native server's).
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

const version = "2026-07-28";
const [mode, ...rest] = process.argv.slice(2);
const run = process.env.MCPTEST_RUN ?? "ts2026";
const charge = process.env.MCPTEST_CHARGE_TOOL ?? "examples.payments.v1.PaymentsService.ChargeCard";
const balance = process.env.MCPTEST_BALANCE_TOOL ?? "examples.payments.v1.PaymentsService.GetBalance";
const metaKey = "io.idemgate/idempotency-key";

// wire holds the body of every tools/call response: the data line of its
// event stream, or the JSON body.
const wire = [];
const recordingFetch = async (url, init) => {
  const res = await fetch(url, init);
  const body = typeof init?.body === "string" ? init.body : "";
  if (!body.includes('"tools/call"')) {
    return res;
  }
  const text = await res.clone().text();
  for (const line of text.split("\n")) {
    const data = line.startsWith("data:") ? line.slice(5).trim() : line.trim();
    if (data.startsWith("{") && data.includes('"result"')) {
      wire.push(data);
    }
  }
  return res;
};

let transport;
if (mode === "stdio") {
  transport = new StdioClientTransport({ command: rest[0], args: rest.slice(1), stderr: "inherit" });
} else if (mode === "http") {
  transport = new StreamableHTTPClientTransport(new URL(rest[0]), { fetch: recordingFetch });
} else {
  console.error("usage: node client2026.mjs stdio <bin> <flags...> | http <url>");
  process.exit(2);
}

const client = new Client({ name: "mcptest-ts2026", version: "1.0.0" }, { versionNegotiation: { mode: { pin: version } } });
await client.connect(transport);

const customer = `cust_ts2026_${run}`;
const chargeWith = (key, amountCents, extra = {}) =>
  client.callTool({
    name: charge,
    arguments: { customerId: customer, amountCents },
    ...(key ? { _meta: { [metaKey]: key } } : {}),
    ...extra,
  });

const out = {};
out.protocolVersion = client.getNegotiatedProtocolVersion();
out.era = client.getProtocolEra();
out.capabilities = client.getServerCapabilities();
out.discover = client.getDiscoverResult();
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
out.wire = wire;

await client.close();
process.stdout.write(JSON.stringify(out) + "\n");

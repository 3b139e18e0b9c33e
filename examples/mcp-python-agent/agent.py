#!/usr/bin/env python3
"""An agent loop that calls gated tools, with the Python standard library
only (no MCP client library): MCP over stdio (newline-delimited JSON-RPC to
the server as a child process) or over streamable HTTP (urllib), against
idemgate-mcp (the bridge in front of the gRPC payments example) or the
native Go MCP server gated by mcpgate (examples/mcp-server).

The orchestration layer, not the model, owns the idempotency key, and which
key covers which retry depends on who retries:

- A retry of ONE tool call below the model (the answer was lost, a timeout,
  a framework retry, an MCP client re-issuing a request whose stream broke)
  resends that call: same tool-call id (OpenAI's tool_call.id, Anthropic's
  tool_use.id), same key, and the tool runs once.
- The model calling again (unsure whether the charge went through) is a NEW
  tool call: real model APIs give it a new id. A key made from the tool-call
  id would be new too, and the card would be charged twice. So this runtime
  keys each side effect by the action it decided before the model ran, and
  the model's second call gets the same key and the first charge's replay.

Which server it talks to, it reads from tools/list:

- the bridge (examples.payments.v1.PaymentsService.ChargeCard, SendReceipt,
  GetBalance): keys "order/<order id>/charge" and, for the receipt it sends
  next, "order/<order id>/receipt";
- the native server (charge_card, get_balance): charge_card's input schema
  marks orderId as the key argument and mcpgate keeps records per tool, so
  the key is the order id, sent in orderId. That server has no receipt
  tool: the receipt step is skipped.

The simulated model below gives every tool call a fresh id, as real APIs do.

    agent.py --stdio idemgate-mcp -target 127.0.0.1:50052 -plaintext
    agent.py --http http://127.0.0.1:8080/mcp
    agent.py --protocol 2025-11-25 --stdio go run ./examples/mcp-server -data-dir /tmp/d

--protocol 2026-07-28 (the default) discovers the server with
server/discover and sends the protocol version, the client's info and its
capabilities in every request's _meta; over HTTP also the MCP-Protocol-Version,
Mcp-Method and Mcp-Name headers (and an Mcp-Param-<name> header for an
argument the tool's schema mirrors with x-mcp-header). A server whose
server/discover is unknown (method not found), refuses the version
(-32022) or does not list 2026-07-28 in supportedVersions is not used: the
agent says so on stderr and exits 2, with no silent fallback, so a run
always says which protocol it spoke; run it again with --protocol
2025-11-25, which sends initialize (and, to a stateful HTTP server that
returns an Mcp-Session-Id, that id on every request and a DELETE at the
end).

It prints one JSON line saying whom it talks to (server, protocolVersion,
capabilities, carrier), then one JSON line per tool call (what happened, the
tool-call id, the key, the arguments sent, whether the answer was a replay),
plus one "explain" line saying what a tool-call-id key would have done, and
exits 0. --carrier says where the key goes: auto (the default: the argument
the tool's schema marks as the key if it marks one, otherwise _meta), meta
(_meta["io.idemgate/idempotency-key"]), param (SEP-3182's idempotencyKey
parameter) or argument (the schema-marked argument).
"""

import argparse
import itertools
import json
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request

META_KEY = "io.idemgate/idempotency-key"  # in _meta; in a schema, the key argument's mark
BRIDGE_CHARGE = "examples.payments.v1.PaymentsService.ChargeCard"
BRIDGE_RECEIPT = "examples.payments.v1.PaymentsService.SendReceipt"
BRIDGE_BALANCE = "examples.payments.v1.PaymentsService.GetBalance"
NATIVE_CHARGE = "charge_card"
NATIVE_BALANCE = "get_balance"

PROTOCOL_2026 = "2026-07-28"  # stateless: server/discover, per-request _meta
PROTOCOL_2025 = "2025-11-25"  # initialize
CLIENT_INFO = {"name": "python-stdlib-agent", "version": "1.1.0"}


class MCPError(Exception):
    """A JSON-RPC error answer."""

    def __init__(self, error):
        super().__init__(error)
        self.error = error if isinstance(error, dict) else {"message": str(error)}


class UnsupportedProtocol(Exception):
    """The server does not speak the protocol version asked for."""


class StdioMCP:
    """MCP over a child process's stdin/stdout, one JSON message a line."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def send(self, msg, headers=None):
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        if "id" not in msg:
            return None
        for line in self.proc.stdout:
            reply = json.loads(line)
            if reply.get("id") == msg["id"] and "method" not in reply:
                return reply
            # Anything else (a notification, a log) is not this call's answer.
        raise EOFError("the MCP server closed its output")

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class HTTPMCP:
    """MCP over streamable HTTP: each message is a POST; the answer comes
    back as JSON or as a server-sent event stream. The servers here are
    stateless and return no Mcp-Session-Id; a stateful server (before
    2026-07-28) does, and gets it back on every request and a DELETE at the
    end."""

    def __init__(self, url):
        self.url = url
        self.session = None
        self.protocol = None  # the MCP-Protocol-Version header, once known

    def send(self, msg, headers=None):
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.session:
            h["Mcp-Session-Id"] = self.session
        if self.protocol:
            h["MCP-Protocol-Version"] = self.protocol
        h.update(headers or {})
        req = urllib.request.Request(self.url, data=json.dumps(msg).encode(), headers=h, method="POST")
        try:
            resp = urllib.request.urlopen(req, timeout=120)
        except urllib.error.HTTPError as e:
            # At 2026-07-28 a refused request (a header that does not match
            # the body, an unknown method) is an HTTP error whose body is
            # the JSON-RPC error.
            body = e.read()
            try:
                reply = json.loads(body)
            except ValueError:
                reply = None
            if isinstance(reply, dict) and "error" in reply:
                return reply
            raise MCPError({"code": e.code, "message": f"HTTP {e.code}: {body.decode(errors='replace').strip()}"})
        with resp:
            self.session = resp.headers.get("Mcp-Session-Id", self.session)
            if "id" not in msg:
                return None
            if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                for data in sse_data(resp):
                    reply = json.loads(data)
                    if reply.get("id") == msg["id"] and "method" not in reply:
                        return reply
                raise EOFError("the event stream ended without an answer")
            return json.loads(resp.read())

    def close(self):
        if self.session:
            req = urllib.request.Request(self.url, headers={"Mcp-Session-Id": self.session}, method="DELETE")
            try:
                urllib.request.urlopen(req, timeout=30).close()
            except OSError:
                pass


def sse_data(resp):
    """The data of each event of a text/event-stream body."""
    lines = []
    for raw in resp:
        line = raw.decode().rstrip("\r\n")
        if line == "":
            if lines:
                yield "\n".join(lines)
            lines = []
        elif line.startswith("data:"):
            lines.append(line[5:].lstrip(" "))
    if lines:
        yield "\n".join(lines)


class Client:
    """The few MCP requests an agent loop needs, at 2026-07-28 (discover,
    then every request self-contained) or 2025-11-25 (initialize)."""

    def __init__(self, conn, protocol):
        self.conn = conn
        self.ids = itertools.count(1)
        self.per_request = protocol == PROTOCOL_2026
        self.supported_versions = None
        if self.per_request:
            if isinstance(conn, HTTPMCP):
                conn.protocol = PROTOCOL_2026
            try:
                reply = self.request("server/discover", {})
            except MCPError as e:
                # Method not found (a server from before 2026-07-28) or
                # unsupported protocol version; anything else is an error.
                if e.error.get("code") not in (-32601, -32022):
                    raise
                raise UnsupportedProtocol(f"server/discover failed: {e.error.get('message')} ({e.error.get('code')})")
            self.supported_versions = reply.get("supportedVersions") or []
            if PROTOCOL_2026 not in self.supported_versions:
                raise UnsupportedProtocol(f"server/discover lists the versions {self.supported_versions}")
            self.protocol = PROTOCOL_2026
            self.capabilities = reply.get("capabilities") or {}
        else:
            reply = self.request("initialize", {
                "protocolVersion": protocol,
                "capabilities": {},
                "clientInfo": CLIENT_INFO,
            })
            self.protocol = reply.get("protocolVersion", protocol)
            self.capabilities = reply.get("capabilities") or {}
            if isinstance(conn, HTTPMCP):
                conn.protocol = self.protocol
            conn.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.tools = {}

    def request(self, method, params, headers=None):
        if self.per_request:
            # 2026-07-28: no session, so every request says who sends it.
            params = dict(params)
            params["_meta"] = dict(params.get("_meta") or {}, **{
                "io.modelcontextprotocol/protocolVersion": PROTOCOL_2026,
                "io.modelcontextprotocol/clientInfo": CLIENT_INFO,
                "io.modelcontextprotocol/clientCapabilities": {},
            })
            headers = dict(headers or {}, **{"Mcp-Method": method})
            if method == "tools/call":
                headers["Mcp-Name"] = params["name"]
        reply = self.conn.send({"jsonrpc": "2.0", "id": next(self.ids), "method": method, "params": params}, headers)
        if "error" in reply:
            raise MCPError(reply["error"])
        result = reply["result"]
        if result.get("resultType", "complete") != "complete":
            # input_required: this agent has nothing to answer with.
            raise MCPError({"message": f"{method}: resultType {result['resultType']!r}"})
        return result

    def list_tools(self):
        cursor = None
        while True:
            result = self.request("tools/list", {"cursor": cursor} if cursor else {})
            for tool in result.get("tools") or []:
                self.tools[tool["name"]] = tool
            cursor = result.get("nextCursor")
            if not cursor:
                return self.tools

    def key_argument(self, name):
        """The argument the tool's input schema marks as its key, if any."""
        props = (self.tools.get(name, {}).get("inputSchema") or {}).get("properties") or {}
        for prop, schema in props.items():
            if isinstance(schema, dict) and schema.get(META_KEY) is True:
                return prop
        return None

    def param_headers(self, name, arguments):
        """SEP-2243: the Mcp-Param-<name> headers of the top-level arguments
        the tool's schema mirrors with x-mcp-header (HTTP at 2026-07-28)."""
        if not (self.per_request and isinstance(self.conn, HTTPMCP)):
            return {}
        props = (self.tools.get(name, {}).get("inputSchema") or {}).get("properties") or {}
        headers = {}
        for prop, schema in props.items():
            header = isinstance(schema, dict) and schema.get("x-mcp-header")
            value = arguments.get(prop)
            if not header or value is None:
                continue
            if isinstance(value, bool):
                value = "true" if value else "false"
            headers["Mcp-Param-" + header] = str(value)  # plain ASCII values only
        return headers

    def call_tool(self, name, arguments, key=None, carrier="meta"):
        """Sends one tools/call; returns the result and the arguments sent."""
        arguments = dict(arguments)
        params = {"name": name}
        if key and carrier == "argument":
            arguments[self.key_argument(name)] = key
        elif key and carrier == "meta":
            params["_meta"] = {META_KEY: key}
        elif key:
            params["idempotencyKey"] = key  # SEP-3182
        params["arguments"] = arguments
        return self.request("tools/call", params, self.param_headers(name, arguments)), arguments


def error_of(result):
    return (result.get("_meta") or {}).get("io.idemgate/error") or {}


class SimulatedModel:
    """Stands in for a model API: every tool call it emits gets a new id,
    as OpenAI's and Anthropic's do, even when it repeats a call it made
    before."""

    def emit(self, name, arguments):
        return {"id": "call_" + secrets.token_hex(6), "name": name, "arguments": arguments}


class Runtime:
    """The orchestration layer. It decided the actions before the model ran
    (this conversation pays one order: charge it, then, where the server has
    the tool, send its receipt) and keys every side effect by that action,
    never by the tool-call id: every call the model makes for the order's
    charge, whatever its id, carries the charge's key."""

    def __init__(self, client, action_keys, carrier):
        self.client = client
        self.action_keys = action_keys
        self.carrier = carrier

    def key_for(self, tool_call):
        """The key of the action this tool call belongs to; None for a read."""
        return self.action_keys.get(tool_call["name"])

    def carrier_for(self, tool_call):
        if self.carrier != "auto":
            return self.carrier
        return "argument" if self.client.key_argument(tool_call["name"]) else "meta"

    def run(self, tool_call, max_attempts=5):
        """Runs one tool call, retrying it by the refusal's advice. Every
        retry resends the same call: same tool-call id, same key."""
        key = self.key_for(tool_call)
        carrier = self.carrier_for(tool_call) if key else None
        for attempt in range(1, max_attempts + 1):
            result, sent = self.client.call_tool(tool_call["name"], tool_call["arguments"], key, carrier)
            err = error_of(result)
            if not result.get("isError"):
                break
            if err.get("advice") == "retry_same_key":
                # IDEMPOTENCY_IN_FLIGHT, IDEMPOTENCY_STORE_UNAVAILABLE, a
                # quota: the same key gets the action's outcome, never a
                # second run.
                time.sleep(err.get("retryAfterSeconds", 0.2))
                continue
            # escalate (IDEMPOTENCY_OUTCOME_UNKNOWN, IDEMPOTENCY_KEY_REUSED,
            # ...): a human or a reconciler decides; retrying cannot tell
            # what happened, and a reused key means the calls under it differ,
            # which a new key would turn into a second side effect.
            # fix_request: the call itself is wrong.
            break
        return {"key": key, "carrier": carrier, "attempts": attempt, "arguments": sent, "result": result}


def text_of(result):
    for c in result.get("content") or []:
        if c.get("type") == "text":
            return c.get("text")
    return None


def report(tool_call, ran, note=""):
    result = ran["result"]
    err = error_of(result)
    print(json.dumps({
        "toolCallId": tool_call["id"],
        "tool": tool_call["name"].rsplit(".", 1)[-1],
        "key": ran["key"],
        "carrier": ran["carrier"],
        "arguments": ran["arguments"],
        "attempts": ran["attempts"],
        "note": note,
        "isError": bool(result.get("isError")),
        "reason": err.get("reason"),
        "advice": err.get("advice"),
        "replayed": (result.get("_meta") or {}).get("io.idemgate/replayed"),
        "resultType": result.get("resultType"),
        "structured": result.get("structuredContent"),
        "text": text_of(result),
    }), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--http", help="the server's streamable HTTP endpoint")
    ap.add_argument("--stdio", nargs=argparse.REMAINDER, help="the server command and its flags")
    ap.add_argument("--protocol", choices=[PROTOCOL_2026, PROTOCOL_2025], default=PROTOCOL_2026,
                    help="the MCP protocol version: 2026-07-28 (server/discover; the default) or 2025-11-25 (initialize)")
    ap.add_argument("--conversation", default="conv-1", help="the conversation (agent run) id, for the explain line")
    ap.add_argument("--order", default="ord_" + secrets.token_hex(4), help="the order this run pays (default: a new one)")
    ap.add_argument("--customer", default="cust_py")
    ap.add_argument("--carrier", choices=["auto", "meta", "param", "argument"], default="auto",
                    help="where the key goes: auto (the schema-marked key argument, else _meta), meta, param (SEP-3182), argument")
    args = ap.parse_args()
    if bool(args.http) == bool(args.stdio):
        ap.error("give one of --http and --stdio")
    conn = HTTPMCP(args.http) if args.http else StdioMCP(args.stdio)
    try:
        return converse(conn, args)
    except UnsupportedProtocol as e:
        print(f"agent.py: the server does not offer protocol {args.protocol}: {e}; "
              f"run with --protocol {PROTOCOL_2025} to use initialize", file=sys.stderr)
        return 2
    finally:
        conn.close()


def converse(conn, args):
    client = Client(conn, args.protocol)
    tools = client.list_tools()
    if BRIDGE_CHARGE in tools:
        server, charge_tool, balance_tool = "bridge", BRIDGE_CHARGE, BRIDGE_BALANCE
        action_keys = {BRIDGE_CHARGE: f"order/{args.order}/charge", BRIDGE_RECEIPT: f"order/{args.order}/receipt"}
    elif NATIVE_CHARGE in tools:
        # mcpgate keeps records per tool: the order id names the order's
        # charge.
        server, charge_tool, balance_tool = "native", NATIVE_CHARGE, NATIVE_BALANCE
        action_keys = {NATIVE_CHARGE: args.order}
    else:
        print(f"agent.py: the server has neither {BRIDGE_CHARGE} nor {NATIVE_CHARGE}: {sorted(tools)}", file=sys.stderr)
        return 2
    if args.carrier == "argument" and not client.key_argument(charge_tool):
        print(f"agent.py: {charge_tool}'s input schema marks no key argument", file=sys.stderr)
        return 2
    print(json.dumps({
        "server": server,
        "protocolVersion": client.protocol,
        "supportedVersions": client.supported_versions,
        "capabilities": client.capabilities,
        "carrier": args.carrier,
    }), flush=True)
    model = SimulatedModel()
    runtime = Runtime(client, action_keys, args.carrier)

    # The model's first turn: charge the order. The server's answer is lost
    # on the way back (simulated: dropped), so the runtime retries the SAME
    # tool call: same tool-call id, same key; the tool replays.
    charge = model.emit(charge_tool, {"customerId": args.customer, "amountCents": 4200})
    report(charge, runtime.run(charge), "answer lost")
    ran = runtime.run(charge)
    report(charge, ran, "runtime retry: same tool call")
    charge_id = ran["result"]["structuredContent"]["chargeId"]

    # The model, unsure the charge went through, calls again: a NEW tool
    # call with a new id. The runtime keys it by the action (this order's
    # charge), so the key is the same and the answer is the first charge's
    # replay: one charge.
    again = model.emit(charge_tool, {"customerId": args.customer, "amountCents": 4200})
    report(again, runtime.run(again), "model re-emits: new tool-call id")
    tool_call_key = f"{args.conversation}/{again['id']}"
    print(json.dumps({
        "explain": f"keyed by the tool-call id, the re-emitted call would have carried {tool_call_key}, "
                   "a key the tool server had never seen, and the card would have been charged a second time; "
                   f"keyed by the action it carried {runtime.key_for(again)} and got the first charge's replay",
        "toolCallIdKey": tool_call_key,
        "actionKey": runtime.key_for(again),
    }), flush=True)

    # Next turn: the order's receipt, another action, another key. The
    # native server has no receipt tool: skipped.
    if server == "bridge":
        receipt = model.emit(BRIDGE_RECEIPT, {"customerId": args.customer, "chargeId": charge_id})
        report(receipt, runtime.run(receipt))

    # The model calls the order's charge again with another amount: the
    # action's key with other arguments is refused (IDEMPOTENCY_KEY_REUSED,
    # advice escalate); nothing is charged, and a person decides.
    wrong = model.emit(charge_tool, {"customerId": args.customer, "amountCents": 9900})
    report(wrong, runtime.run(wrong), "model re-emits with another amount")

    # A read needs no key.
    balance = model.emit(balance_tool, {"customerId": args.customer})
    report(balance, runtime.run(balance))
    return 0


if __name__ == "__main__":
    sys.exit(main())

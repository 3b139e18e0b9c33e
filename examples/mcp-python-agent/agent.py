#!/usr/bin/env python3
"""An agent loop that calls gated tools through idemgate-mcp, with the
Python standard library only (no MCP client library): MCP over stdio
(newline-delimited JSON-RPC to the bridge as a child process) or over
streamable HTTP (urllib).

The orchestration layer, not the model, owns the idempotency key, and which
key covers which retry depends on who retries:

- A retry of ONE tool call below the model (the answer was lost, a timeout,
  a framework retry, an MCP client re-issuing a request whose stream broke)
  resends that call: same tool-call id (OpenAI's tool_call.id, Anthropic's
  tool_use.id), same key, and the tool runs once.
- The model calling again (unsure whether the charge went through) is a NEW
  tool call: real model APIs give it a new id. A key made from the tool-call
  id would be new too, and the card would be charged twice. So this runtime
  keys each side effect by the action it decided before the model ran:
  "order/<order id>/charge", "order/<order id>/receipt". The model's second
  call gets the same key and the first charge's replay.

The simulated model below gives every tool call a fresh id, as real APIs do.

    agent.py --stdio idemgate-mcp -target 127.0.0.1:50052 -plaintext
    agent.py --http http://127.0.0.1:8080/mcp

It prints one JSON line per tool call (what happened, the tool-call id, the
key, whether the answer was a replay), plus one "explain" line saying what a
tool-call-id key would have done, and exits 0. --carrier param sends the key
as SEP-3182's idempotencyKey parameter instead of _meta.
"""

import argparse
import itertools
import json
import secrets
import subprocess
import sys
import time
import urllib.request

META_KEY = "io.idemgate/idempotency-key"
CHARGE = "examples.payments.v1.PaymentsService.ChargeCard"
RECEIPT = "examples.payments.v1.PaymentsService.SendReceipt"
BALANCE = "examples.payments.v1.PaymentsService.GetBalance"
PROTOCOL = "2025-06-18"


class MCPError(Exception):
    """A JSON-RPC error answer."""


class StdioMCP:
    """MCP over a child process's stdin/stdout, one JSON message a line."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def send(self, msg):
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        if "id" not in msg:
            return None
        for line in self.proc.stdout:
            reply = json.loads(line)
            if reply.get("id") == msg["id"]:
                return reply
            # Anything else (a notification, a log) is not this call's answer.
        raise EOFError("the MCP server closed its output")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class HTTPMCP:
    """MCP over streamable HTTP: each message is a POST; the answer comes
    back as JSON or as a server-sent event stream."""

    def __init__(self, url):
        self.url = url
        self.session = None
        self.protocol = None

    def send(self, msg):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        if self.protocol:
            headers["MCP-Protocol-Version"] = self.protocol
        req = urllib.request.Request(self.url, data=json.dumps(msg).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=120) as resp:
            self.session = resp.headers.get("Mcp-Session-Id", self.session)
            if "id" not in msg:
                return None
            if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                for data in sse_data(resp):
                    reply = json.loads(data)
                    if reply.get("id") == msg["id"]:
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
    """The few MCP requests an agent loop needs."""

    def __init__(self, conn):
        self.conn = conn
        self.ids = itertools.count(1)
        reply = self.request("initialize", {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "python-stdlib-agent", "version": "1.0.0"},
        })
        self.capabilities = reply.get("capabilities", {})
        if hasattr(conn, "protocol"):
            conn.protocol = reply.get("protocolVersion", PROTOCOL)
        conn.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def request(self, method, params):
        reply = self.conn.send({"jsonrpc": "2.0", "id": next(self.ids), "method": method, "params": params})
        if "error" in reply:
            raise MCPError(reply["error"])
        return reply["result"]

    def call_tool(self, name, arguments, key=None, carrier="meta"):
        params = {"name": name, "arguments": arguments}
        if key and carrier == "meta":
            params["_meta"] = {META_KEY: key}
        elif key:
            params["idempotencyKey"] = key  # SEP-3182
        return self.request("tools/call", params)


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
    (this conversation pays one order: charge it, then send its receipt) and
    keys every side effect by that action, never by the tool-call id: every
    call the model makes for the order's charge, whatever its id, carries
    "order/<order id>/charge"."""

    def __init__(self, client, order, carrier):
        self.client = client
        self.carrier = carrier
        self.action_keys = {CHARGE: f"order/{order}/charge", RECEIPT: f"order/{order}/receipt"}

    def key_for(self, tool_call):
        """The key of the action this tool call belongs to; None for a read."""
        return self.action_keys.get(tool_call["name"])

    def run(self, tool_call, max_attempts=5):
        """Runs one tool call, retrying it by the refusal's advice. Every
        retry resends the same call: same tool-call id, same key."""
        key = self.key_for(tool_call)
        for attempt in range(1, max_attempts + 1):
            result = self.client.call_tool(tool_call["name"], tool_call["arguments"], key, self.carrier)
            err = error_of(result)
            if not result.get("isError"):
                return key, attempt, result
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
            return key, attempt, result
        return key, max_attempts, result


def text_of(result):
    for c in result.get("content") or []:
        if c.get("type") == "text":
            return c.get("text")
    return None


def report(tool_call, key, attempts, result, note=""):
    err = error_of(result)
    print(json.dumps({
        "toolCallId": tool_call["id"],
        "tool": tool_call["name"].rsplit(".", 1)[-1],
        "key": key,
        "attempts": attempts,
        "note": note,
        "isError": bool(result.get("isError")),
        "reason": err.get("reason"),
        "advice": err.get("advice"),
        "replayed": (result.get("_meta") or {}).get("io.idemgate/replayed"),
        "structured": result.get("structuredContent"),
        "text": text_of(result),
    }), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--http", help="the bridge's streamable HTTP endpoint")
    ap.add_argument("--stdio", nargs=argparse.REMAINDER, help="the bridge command and its flags")
    ap.add_argument("--conversation", default="conv-1", help="the conversation (agent run) id, for the explain line")
    ap.add_argument("--order", default="ord_" + secrets.token_hex(4), help="the order this run pays (default: a new one)")
    ap.add_argument("--customer", default="cust_py")
    ap.add_argument("--carrier", choices=["meta", "param"], default="meta")
    args = ap.parse_args()
    if bool(args.http) == bool(args.stdio):
        ap.error("give one of --http and --stdio")
    conn = HTTPMCP(args.http) if args.http else StdioMCP(args.stdio)
    client = Client(conn)
    print(json.dumps({"capabilities": client.capabilities}), flush=True)
    model = SimulatedModel()
    runtime = Runtime(client, args.order, args.carrier)

    # The model's first turn: charge the order. The bridge's answer is lost
    # on the way back (simulated: dropped), so the runtime retries the SAME
    # tool call: same tool-call id, same key; the tool replays.
    charge = model.emit(CHARGE, {"customerId": args.customer, "amountCents": 4200})
    report(charge, *runtime.run(charge), "answer lost")
    key, attempts, result = runtime.run(charge)
    report(charge, key, attempts, result, "runtime retry: same tool call")
    charge_id = result["structuredContent"]["chargeId"]

    # The model, unsure the charge went through, calls again: a NEW tool
    # call with a new id. The runtime keys it by the action (this order's
    # charge), so the key is the same and the answer is the first charge's
    # replay: one charge.
    again = model.emit(CHARGE, {"customerId": args.customer, "amountCents": 4200})
    report(again, *runtime.run(again), "model re-emits: new tool-call id")
    tool_call_key = f"{args.conversation}/{again['id']}"
    print(json.dumps({
        "explain": f"keyed by the tool-call id, the re-emitted call would have carried {tool_call_key}, "
                   "a key the tool server had never seen, and the card would have been charged a second time; "
                   f"keyed by the action it carried {runtime.key_for(again)} and got the first charge's replay",
        "toolCallIdKey": tool_call_key,
        "actionKey": runtime.key_for(again),
    }), flush=True)

    # Next turn: the order's receipt, another action, another key.
    receipt = model.emit(RECEIPT, {"customerId": args.customer, "chargeId": charge_id})
    report(receipt, *runtime.run(receipt))

    # The model calls the order's charge again with another amount: the
    # action's key with other arguments is refused (IDEMPOTENCY_KEY_REUSED,
    # advice escalate); nothing is charged, and a person decides.
    wrong = model.emit(CHARGE, {"customerId": args.customer, "amountCents": 9900})
    report(wrong, *runtime.run(wrong), "model re-emits with another amount")

    # A read needs no key.
    balance = model.emit(BALANCE, {"customerId": args.customer})
    report(balance, *runtime.run(balance))
    conn.close()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""An agent loop that calls gated tools through idemgate-mcp, with the
Python standard library only (no MCP client library): MCP over stdio
(newline-delimited JSON-RPC to the bridge as a child process) or over
streamable HTTP (urllib).

The orchestration layer, not the model, owns the idempotency key: each
tool call the model emits has an id (OpenAI's tool_call.id, Anthropic's
tool_use.id), stable for that call, so the key is "<conversation>/<tool
call id>". Every retry of that call -- after a lost answer, a timeout, or
the model emitting the same call again -- reuses it, and the tool runs once.

    agent.py --stdio idemgate-mcp -target 127.0.0.1:50052 -plaintext
    agent.py --http http://127.0.0.1:8080/mcp

It prints one JSON line per tool call (what happened, the key, whether the
answer was a replay) and exits 0. --carrier param sends the key as
SEP-3182's idempotencyKey parameter instead of _meta.
"""

import argparse
import itertools
import json
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


def call_action(client, conversation, tool_call, carrier, max_attempts=5):
    """Runs one tool call the model emitted, as one logical action: the key
    is minted from the tool call's id, and every retry reuses it. What the
    caller does with each refusal is decided by its reason."""
    key = f"{conversation}/{tool_call['id']}"
    for attempt in range(1, max_attempts + 1):
        result = client.call_tool(tool_call["name"], tool_call["arguments"], key, carrier)
        err = error_of(result)
        advice = err.get("advice")
        if not result.get("isError"):
            return key, attempt, result
        if advice == "retry_same_key":
            # IDEMPOTENCY_IN_FLIGHT, IDEMPOTENCY_STORE_UNAVAILABLE, a quota:
            # the same key gets the action's outcome, never a second run.
            time.sleep(err.get("retryAfterSeconds", 0.2))
            continue
        # escalate (IDEMPOTENCY_OUTCOME_UNKNOWN, IDEMPOTENCY_KEY_REUSED, ...):
        # a human or a reconciler decides; retrying cannot tell what
        # happened, and a reused key is a bug in the orchestration, which a
        # new key would turn into a second side effect.
        # fix_request: the call itself is wrong.
        return key, attempt, result
    return key, max_attempts, result


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
    }), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--http", help="the bridge's streamable HTTP endpoint")
    ap.add_argument("--stdio", nargs=argparse.REMAINDER, help="the bridge command and its flags")
    ap.add_argument("--conversation", default="conv-1", help="the conversation (agent run) id")
    ap.add_argument("--customer", default="cust_py")
    ap.add_argument("--carrier", choices=["meta", "param"], default="meta")
    args = ap.parse_args()
    if bool(args.http) == bool(args.stdio):
        ap.error("give one of --http and --stdio")
    conn = HTTPMCP(args.http) if args.http else StdioMCP(args.stdio)
    client = Client(conn)
    print(json.dumps({"capabilities": client.capabilities}), flush=True)

    # The model's first turn: charge the order. The bridge's answer is lost
    # on the way back (simulated: dropped), so the runtime retries it.
    charge = {"id": "call_7QXf2", "name": CHARGE, "arguments": {"customerId": args.customer, "amountCents": 4200}}
    key, attempts, lost = call_action(client, args.conversation, charge, args.carrier)
    report(charge, key, attempts, lost, "answer lost")
    key, attempts, result = call_action(client, args.conversation, charge, args.carrier)
    report(charge, key, attempts, result, "runtime retry")
    charge_id = result["structuredContent"]["chargeId"]

    # The model, unsure, emits the same tool call again: same id, same key.
    key, attempts, again = call_action(client, args.conversation, charge, args.carrier)
    report(charge, key, attempts, again, "model re-emits")

    # Next turn: a receipt, a new tool call, a new key.
    receipt = {"id": "call_Hk3p9", "name": RECEIPT, "arguments": {"customerId": args.customer, "chargeId": charge_id}}
    report(receipt, *call_action(client, args.conversation, receipt, args.carrier))

    # A bug in the orchestration: a new action (another amount) under the
    # charge's key is refused with IDEMPOTENCY_KEY_REUSED, advice escalate.
    wrong = {"id": charge["id"], "name": CHARGE, "arguments": {"customerId": args.customer, "amountCents": 9900}}
    report(wrong, *call_action(client, args.conversation, wrong, args.carrier), "key reused for another action")

    # A read needs no key.
    balance = {"id": "call_b4L", "name": BALANCE, "arguments": {"customerId": args.customer}}
    report(balance, None, 1, client.call_tool(BALANCE, balance["arguments"]))
    conn.close()


if __name__ == "__main__":
    sys.exit(main())

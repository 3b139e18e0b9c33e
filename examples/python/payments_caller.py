#!/usr/bin/env python3
"""Call the idemgate-gated example payments tool from Python.

What a caller of a gated tool does, in any language:

* mint one idempotency key per logical action (not per call) and send it in
  the ``idempotency-key`` metadata on every attempt at that action;
* read the ``idempotency-replayed`` response header: ``true`` means the
  stored outcome of an earlier attempt answered, byte for byte;
* on an error, decode the ``google.rpc.Status`` in the
  ``grpc-status-details-bin`` trailer to get ``ErrorInfo.reason`` and
  ``RetryInfo.retry_delay``;
* retry with the SAME key when the reason says so (``IDEMPOTENCY_IN_FLIGHT``
  after the delay, ``UNAVAILABLE``), and escalate to a person when the reason
  is ``IDEMPOTENCY_OUTCOME_UNKNOWN`` or ``IDEMPOTENCY_KEY_REUSED``: no retry
  and no new key can settle those.

It needs only ``grpcio`` and ``protobuf`` (Debian: ``apt-get install
python3-grpcio python3-protobuf``; run it with /usr/bin/python3). The message
types come from the descriptor set ``make protos-export`` writes, so no code
is generated::

    make protos-export
    /usr/bin/python3 examples/python/payments_caller.py \\
        --target 127.0.0.1:50052 --descriptor-set protos/idemgate-callers.binpb

Run as a script it plays a short scenario against the payments tool and
prints one JSON object per step.
"""

import argparse
import json
import sys
import time
import uuid

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

# The request metadata that carries the action's key.
KEY_HEADER = "idempotency-key"
# The response header that says "true" when a stored outcome answered.
REPLAYED_HEADER = "idempotency-replayed"
# The trailer with the serialized google.rpc.Status of a failed call.
STATUS_DETAILS_TRAILER = "grpc-status-details-bin"
# The example tool's service.
SERVICE = "examples.payments.v1.PaymentsService"

# Reasons a retry with the same key can get past, after RetryInfo's delay.
RETRY_SAME_KEY_REASONS = {"IDEMPOTENCY_IN_FLIGHT", "IDEMPOTENCY_STORE_UNAVAILABLE"}
# Reasons only a person can settle: the side effect may have happened
# (OUTCOME_UNKNOWN), or the key names another action (KEY_REUSED).
ESCALATE_REASONS = {"IDEMPOTENCY_OUTCOME_UNKNOWN", "IDEMPOTENCY_KEY_REUSED"}


class Protos:
    """Message classes built at run time from a FileDescriptorSet."""

    def __init__(self, path):
        with open(path, "rb") as f:
            fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
        self.pool = descriptor_pool.DescriptorPool()
        for file_proto in fds.file:
            self.pool.Add(file_proto)
        self._factory = None

    def message(self, full_name):
        """Returns the class of the message type full_name."""
        desc = self.pool.FindMessageTypeByName(full_name)
        if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
            return message_factory.GetMessageClass(desc)
        if self._factory is None:
            self._factory = message_factory.MessageFactory(self.pool)
        return self._factory.GetPrototype(desc)


class CallError(Exception):
    """A failed call, with its google.rpc details decoded."""

    def __init__(self, code, message, reason="", metadata=None, retry_delay=None):
        super().__init__(f"{code.name} {reason or '(no reason)'}: {message}")
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = metadata or {}
        self.retry_delay = retry_delay  # seconds, or None without RetryInfo


class Escalate(CallError):
    """A failure no retry can settle: hand it to a person."""


def decode_error(protos, err):
    """Turns a grpc.RpcError into a CallError with ErrorInfo and RetryInfo read
    from the grpc-status-details-bin trailer."""
    reason, metadata, retry_delay = "", {}, None
    for key, value in err.trailing_metadata() or ():
        if key != STATUS_DETAILS_TRAILER:
            continue
        status = protos.message("google.rpc.Status").FromString(value)
        for detail in status.details:
            name = detail.type_url.rsplit("/", 1)[-1]
            if name == "google.rpc.ErrorInfo":
                info = protos.message(name).FromString(detail.value)
                reason, metadata = info.reason, dict(info.metadata)
            elif name == "google.rpc.RetryInfo":
                delay = protos.message(name).FromString(detail.value).retry_delay
                retry_delay = delay.seconds + delay.nanos / 1e9
    cls = Escalate if reason in ESCALATE_REASONS else CallError
    return cls(err.code(), err.details(), reason, metadata, retry_delay)


def retryable(e):
    """Whether a retry with the same key may succeed."""
    return e.reason in RETRY_SAME_KEY_REASONS or e.code == grpc.StatusCode.UNAVAILABLE


class PaymentsCaller:
    """Calls PaymentsService methods with a key, retrying with the same key."""

    def __init__(self, channel, protos, max_attempts=4, backoff=0.2, timeout=5.0, sleep=time.sleep):
        self.channel, self.protos = channel, protos
        self.max_attempts, self.backoff, self.timeout = max_attempts, backoff, timeout
        self.sleep = sleep
        # (method, key, code name) of every attempt, for whoever audits retries.
        self.attempts = []

    def call(self, method, request, key):
        """Calls method with request under key (None: no key) and returns
        (response, raw response bytes, replayed). Retries with the same key on
        retryable errors; raises Escalate or CallError otherwise."""
        desc = self.protos.pool.FindServiceByName(SERVICE).FindMethodByName(method)
        response_class = self.protos.message(desc.output_type.full_name)
        # The raw bytes are kept, to show a replay is byte-identical.
        rpc = self.channel.unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lambda raw: raw,
        )
        metadata = [(KEY_HEADER, key)] if key is not None else []
        for attempt in range(1, self.max_attempts + 1):
            try:
                raw, call = rpc.with_call(request, metadata=metadata, timeout=self.timeout)
            except grpc.RpcError as err:
                e = decode_error(self.protos, err)
                self.attempts.append((method, key, e.code.name))
                if isinstance(e, Escalate) or not retryable(e) or attempt == self.max_attempts:
                    raise e
                # RetryInfo says when; without it, back off exponentially.
                self.sleep(e.retry_delay if e.retry_delay is not None else self.backoff * 2 ** (attempt - 1))
                continue
            self.attempts.append((method, key, "OK"))
            replayed = dict(call.initial_metadata() or ()).get(REPLAYED_HEADER) == "true"
            return response_class.FromString(raw), raw, replayed
        raise AssertionError("unreachable")


def new_action_key(action):
    """Mints the key of one logical action, once; every retry of the action reuses it."""
    return f"{action}-{uuid.uuid4()}"


def scenario(target, protos, name="main", backoff=0.2):
    """Plays a scenario against the payments tool and yields one dict per step.

    "main": a charge, its retry (a replay), a new action, a keyless call and a
    key reused with other arguments. "store-down": one charge while the
    Dedupe service is down, retried with the same key until the attempts run
    out."""
    charge = protos.message("examples.payments.v1.ChargeCardRequest")
    caller = PaymentsCaller(grpc.insecure_channel(target), protos, max_attempts=3, backoff=backoff)

    def ok(step, key, result):
        response, raw, replayed = result
        return {"step": step, "key": key, "code": "OK", "replayed": replayed, "response_hex": raw.hex(),
                "charge_id": response.charge_id}

    def attempt(step, key, req):
        caller.attempts.clear()
        try:
            out = ok(step, key, caller.call("ChargeCard", req, key))
        except CallError as e:
            out = {"step": step, "key": key, "code": e.code.name, "reason": e.reason, "escalate": isinstance(e, Escalate),
                   "retry_delay": e.retry_delay, "message": e.message}
        out["attempt_keys"] = [k for _, k, _ in caller.attempts]
        return out

    request = charge(customer_id="cust_py", amount_cents=4200)
    if name == "store-down":
        yield attempt("store_down", new_action_key("order-charge"), request)
        return
    order = new_action_key("order-charge")
    yield attempt("charge", order, request)
    # The same action again (a timeout, a framework retry): the same key.
    yield attempt("retry", order, request)
    # A new action, even with the same arguments: a new key.
    yield attempt("new_action", new_action_key("order-charge"), request)
    yield attempt("keyless", None, request)
    # A bug: the first order's key sent with another order's arguments.
    yield attempt("reused", order, charge(customer_id="cust_py", amount_cents=9900))


def main():
    """Plays the scenario the flags name and prints its steps as JSON lines."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="127.0.0.1:50052", help="address of the payments tool server")
    parser.add_argument("--descriptor-set", required=True, help="FileDescriptorSet from make protos-export")
    parser.add_argument("--scenario", choices=("main", "store-down"), default="main",
                        help="main: replay, new action, keyless, reused key; store-down: retries while the Dedupe service is down")
    parser.add_argument("--backoff", type=float, default=0.2, help="first retry delay in seconds without RetryInfo")
    args = parser.parse_args()
    for step in scenario(args.target, Protos(args.descriptor_set), args.scenario, args.backoff):
        print(json.dumps(step), flush=True)


if __name__ == "__main__":
    sys.exit(main())

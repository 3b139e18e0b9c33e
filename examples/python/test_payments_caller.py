"""Unit tests of payments_caller's retry decisions, against a scripted channel.

Run with the descriptor set make protos-export writes:

    IDEMGATE_DESCRIPTOR_SET=protos/idemgate-callers.binpb /usr/bin/python3 -m unittest discover -s examples/python
"""

import os
import unittest

import grpc

import payments_caller as pc

DESCRIPTOR_SET = os.environ.get("IDEMGATE_DESCRIPTOR_SET", "protos/idemgate-callers.binpb")


class FakeError(grpc.RpcError):
    """A failed call as grpcio raises it: code, details and trailers."""

    def __init__(self, code, details, trailers=()):
        super().__init__(details)
        self._code, self._details, self._trailers = code, details, trailers

    def code(self):
        """The status code."""
        return self._code

    def details(self):
        """The status message."""
        return self._details

    def trailing_metadata(self):
        """The trailers, grpc-status-details-bin among them."""
        return self._trailers


class FakeCall:
    """A finished call as grpcio returns it with the response: its header."""

    def __init__(self, header):
        self._header = header

    def initial_metadata(self):
        """The response header."""
        return self._header


class ScriptedChannel:
    """Answers each attempt with the next scripted outcome and records what was sent."""

    def __init__(self, script):
        self.script, self.sent = list(script), []

    def unary_unary(self, path, request_serializer, response_deserializer):
        """A multi-callable whose with_call answers from the script."""

        def with_call(request, metadata, timeout):
            self.sent.append((path, dict(metadata)))
            outcome = self.script.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return response_deserializer(outcome), FakeCall((("idempotency-replayed", "true"),))

        return type("MultiCallable", (), {"with_call": staticmethod(with_call)})()


class RetryDecisions(unittest.TestCase):
    """What PaymentsCaller.call does with each kind of answer."""

    @classmethod
    def setUpClass(cls):
        cls.protos = pc.Protos(DESCRIPTOR_SET)

    def error(self, code, reason, retry_seconds=None):
        """A refusal as the interceptor sends it: ErrorInfo, and RetryInfo when retry_seconds is set."""
        status = self.protos.message("google.rpc.Status")(code=code.value[0], message=reason)
        info = self.protos.message("google.rpc.ErrorInfo")(reason=reason, domain="idemgate.dev")
        status.details.add(type_url="type.googleapis.com/google.rpc.ErrorInfo", value=info.SerializeToString())
        if retry_seconds is not None:
            retry = self.protos.message("google.rpc.RetryInfo")()
            retry.retry_delay.seconds = int(retry_seconds)
            retry.retry_delay.nanos = int(round((retry_seconds % 1) * 1e9))
            status.details.add(type_url="type.googleapis.com/google.rpc.RetryInfo", value=retry.SerializeToString())
        return FakeError(code, reason, ((pc.STATUS_DETAILS_TRAILER, status.SerializeToString()),))

    def caller(self, script):
        """A caller on a scripted channel, its channel, and the delays it slept."""
        channel, slept = ScriptedChannel(script), []
        return pc.PaymentsCaller(channel, self.protos, max_attempts=4, backoff=0.1, sleep=slept.append), channel, slept

    def request(self):
        """A ChargeCard request."""
        return self.protos.message("examples.payments.v1.ChargeCardRequest")(customer_id="c", amount_cents=1)

    def response(self):
        """A ChargeCard response, serialized as it comes over the wire."""
        return self.protos.message("examples.payments.v1.ChargeCardResponse")(charge_id="ch_1").SerializeToString()

    def keys(self, channel):
        """The key each attempt sent (None: no key)."""
        return [md.get(pc.KEY_HEADER) for _, md in channel.sent]

    def test_in_flight_is_retried_with_the_same_key_after_the_delay(self):
        caller, channel, slept = self.caller([self.error(grpc.StatusCode.ABORTED, "IDEMPOTENCY_IN_FLIGHT", 1.5), self.response()])
        response, _, replayed = caller.call("ChargeCard", self.request(), "order-1")
        self.assertEqual((response.charge_id, replayed), ("ch_1", True))
        self.assertEqual(self.keys(channel), ["order-1", "order-1"])
        self.assertEqual(slept, [1.5])

    def test_unavailable_without_retry_info_backs_off(self):
        unavailable = FakeError(grpc.StatusCode.UNAVAILABLE, "connection refused")
        caller, channel, slept = self.caller([unavailable, unavailable, self.response()])
        caller.call("ChargeCard", self.request(), "order-2")
        self.assertEqual(self.keys(channel), ["order-2"] * 3)
        self.assertEqual(slept, [0.1, 0.2])

    def test_escalations_are_neither_retried_nor_rekeyed(self):
        for code, reason in ((grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_OUTCOME_UNKNOWN"),
                             (grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_KEY_REUSED")):
            with self.subTest(reason=reason):
                caller, channel, slept = self.caller([self.error(code, reason), self.response()])
                with self.assertRaises(pc.Escalate) as raised:
                    caller.call("ChargeCard", self.request(), "order-3")
                self.assertEqual(raised.exception.reason, reason)
                self.assertEqual((len(channel.sent), slept), (1, []))

    def test_other_refusals_are_returned_at_once(self):
        caller, channel, slept = self.caller([self.error(grpc.StatusCode.INVALID_ARGUMENT, "IDEMPOTENCY_KEY_MISSING")])
        with self.assertRaises(pc.CallError) as raised:
            caller.call("ChargeCard", self.request(), None)
        self.assertNotIsInstance(raised.exception, pc.Escalate)
        self.assertEqual((raised.exception.reason, len(channel.sent), slept), ("IDEMPOTENCY_KEY_MISSING", 1, []))
        self.assertNotIn(pc.KEY_HEADER, channel.sent[0][1])

    def test_attempts_run_out(self):
        caller, channel, slept = self.caller([self.error(grpc.StatusCode.UNAVAILABLE, "IDEMPOTENCY_STORE_UNAVAILABLE", 1)] * 4)
        with self.assertRaises(pc.CallError) as raised:
            caller.call("ChargeCard", self.request(), "order-4")
        self.assertEqual((raised.exception.retry_delay, len(channel.sent), slept), (1.0, 4, [1.0, 1.0, 1.0]))


if __name__ == "__main__":
    unittest.main()

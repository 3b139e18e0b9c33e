// Unit tests of the caller's retry decisions, with scripted attempts:
//
//   npm run build && IDEMGATE_DESCRIPTOR_SET=../../protos/idemgate-callers.binpb node --test dist/
import assert from "node:assert/strict";
import { test } from "node:test";

import * as grpc from "@grpc/grpc-js";

import { CallError, Escalate, PaymentsCaller, Protos, Result, STATUS_DETAILS_TRAILER } from "./payments_caller";

const protos = new Protos(process.env.IDEMGATE_DESCRIPTOR_SET ?? "../../protos/idemgate-callers.binpb");

/** A refusal as the interceptor sends it: ErrorInfo, and RetryInfo when retrySeconds is set. */
function refusal(code: grpc.status, reason: string, retrySeconds?: number): grpc.ServiceError {
  const any = (name: string, value: object) => ({
    type_url: `type.googleapis.com/${name}`,
    value: protos.type(name).encode(protos.type(name).fromObject(value)).finish(),
  });
  const details = [any("google.rpc.ErrorInfo", { reason, domain: "idemgate.dev" })];
  if (retrySeconds !== undefined) {
    details.push(any("google.rpc.RetryInfo", { retry_delay: { seconds: Math.floor(retrySeconds), nanos: Math.round((retrySeconds % 1) * 1e9) } }));
  }
  const status = protos.type("google.rpc.Status");
  const metadata = new grpc.Metadata();
  metadata.set(STATUS_DETAILS_TRAILER, Buffer.from(status.encode(status.fromObject({ code, message: reason, details })).finish()));
  return Object.assign(new Error(reason), { code, details: reason, metadata });
}

/** A PaymentsCaller whose attempts answer from a script and whose sleeps are recorded. */
class Scripted extends PaymentsCaller {
  readonly keys: (string | null)[] = [];
  readonly slept: number[] = [];

  constructor(private readonly script: (grpc.ServiceError | Result)[]) {
    super("127.0.0.1:1", protos, 4, 0.1);
  }

  protected override async once(_method: string, _request: Record<string, unknown>, key: string | null): Promise<Result> {
    this.keys.push(key);
    const next = this.script.shift();
    if (next === undefined || next instanceof Error) {
      throw next;
    }
    return next;
  }

  protected override async sleep(seconds: number): Promise<void> {
    this.slept.push(seconds);
  }
}

const ok: Result = { response: { charge_id: "ch_1" }, raw: Buffer.from([]), replayed: true };
const request = { customer_id: "c", amount_cents: 1 };

test("IN_FLIGHT is retried with the same key after RetryInfo's delay", async () => {
  const caller = new Scripted([refusal(grpc.status.ABORTED, "IDEMPOTENCY_IN_FLIGHT", 1.5), ok]);
  const result = await caller.call("ChargeCard", request, "order-1");
  assert.equal(result.response.charge_id, "ch_1");
  assert.deepEqual(caller.keys, ["order-1", "order-1"]);
  assert.deepEqual(caller.slept, [1.5]);
  caller.close();
});

test("UNAVAILABLE without RetryInfo backs off, with the same key", async () => {
  const unavailable = Object.assign(new Error("refused"), { code: grpc.status.UNAVAILABLE, details: "refused", metadata: new grpc.Metadata() });
  const caller = new Scripted([unavailable, unavailable, ok]);
  await caller.call("ChargeCard", request, "order-2");
  assert.deepEqual(caller.keys, ["order-2", "order-2", "order-2"]);
  assert.deepEqual(caller.slept, [0.1, 0.2]);
  caller.close();
});

for (const reason of ["IDEMPOTENCY_OUTCOME_UNKNOWN", "IDEMPOTENCY_KEY_REUSED"]) {
  test(`${reason} escalates: no retry, no new key`, async () => {
    const caller = new Scripted([refusal(grpc.status.FAILED_PRECONDITION, reason), ok]);
    await assert.rejects(caller.call("ChargeCard", request, "order-3"), (e: unknown) => e instanceof Escalate && e.reason === reason);
    assert.deepEqual(caller.keys, ["order-3"]);
    assert.deepEqual(caller.slept, []);
    caller.close();
  });
}

test("other refusals are returned at once", async () => {
  const caller = new Scripted([refusal(grpc.status.INVALID_ARGUMENT, "IDEMPOTENCY_KEY_MISSING")]);
  await assert.rejects(caller.call("ChargeCard", request, null),
    (e: unknown) => e instanceof CallError && !(e instanceof Escalate) && e.reason === "IDEMPOTENCY_KEY_MISSING");
  assert.deepEqual(caller.keys, [null]);
  assert.deepEqual(caller.slept, []);
  caller.close();
});

test("the attempts run out", async () => {
  const caller = new Scripted(Array(4).fill(refusal(grpc.status.UNAVAILABLE, "IDEMPOTENCY_STORE_UNAVAILABLE", 1)));
  await assert.rejects(caller.call("ChargeCard", request, "order-4"), (e: unknown) => e instanceof CallError && e.retryDelay === 1);
  assert.equal(caller.keys.length, 4);
  assert.deepEqual(caller.slept, [1, 1, 1]);
  caller.close();
});

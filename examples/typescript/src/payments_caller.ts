// Call the idemgate-gated example payments tool from TypeScript.
//
// What a caller of a gated tool does, in any language:
//
//   - mint one idempotency key per logical action (not per call) and send it
//     in the `idempotency-key` metadata on every attempt at that action;
//   - read the `idempotency-replayed` response header: "true" means the
//     stored outcome of an earlier attempt answered, byte for byte;
//   - on an error, decode the google.rpc.Status in the
//     `grpc-status-details-bin` trailer to get ErrorInfo.reason and
//     RetryInfo.retry_delay;
//   - retry with the SAME key when the reason says so (IDEMPOTENCY_IN_FLIGHT
//     after the delay, UNAVAILABLE), and escalate to a person on
//     IDEMPOTENCY_OUTCOME_UNKNOWN or IDEMPOTENCY_KEY_REUSED: no retry and no
//     new key can settle those.
//
// It uses @grpc/grpc-js and @grpc/proto-loader, and reads every message type
// from the descriptor set `make protos-export` writes, so nothing is
// generated:
//
//   make protos-export
//   cd examples/typescript && npm ci && npm run build
//   node dist/payments_caller.js --target 127.0.0.1:50052 --descriptor-set ../../protos/idemgate-callers.binpb
//
// Run as a script it plays a short scenario against the payments tool and
// prints one JSON object per step.

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import * as protobuf from "protobufjs";
import "protobufjs/ext/descriptor"; // adds Root.fromDescriptor

/** The request metadata that carries the action's key. */
export const KEY_HEADER = "idempotency-key";
/** The response header that says "true" when a stored outcome answered. */
export const REPLAYED_HEADER = "idempotency-replayed";
/** The trailer with the serialized google.rpc.Status of a failed call. */
export const STATUS_DETAILS_TRAILER = "grpc-status-details-bin";
/** The example tool's service. */
export const SERVICE = "examples.payments.v1.PaymentsService";

/** Reasons a retry with the same key can get past, after RetryInfo's delay. */
export const RETRY_SAME_KEY_REASONS = new Set(["IDEMPOTENCY_IN_FLIGHT", "IDEMPOTENCY_STORE_UNAVAILABLE"]);
/** Reasons only a person can settle: the side effect may have happened
 * (OUTCOME_UNKNOWN), or the key names another action (KEY_REUSED). */
export const ESCALATE_REASONS = new Set(["IDEMPOTENCY_OUTCOME_UNKNOWN", "IDEMPOTENCY_KEY_REUSED"]);

/** The service's methods and every message type, from a FileDescriptorSet. */
export class Protos {
  /** Every message type of the set, for decoding the google.rpc details. */
  readonly root: protobuf.Root;
  /** PaymentsService's methods: paths, serializers and deserializers. */
  readonly service: grpc.ServiceDefinition;

  constructor(path: string) {
    const set = readFileSync(path);
    const fromDescriptor = (protobuf.Root as unknown as { fromDescriptor(b: Uint8Array): protobuf.Root }).fromDescriptor;
    this.root = fromDescriptor(set);
    const pkg = protoLoader.loadFileDescriptorSetFromBuffer(set, { keepCase: true, longs: String, defaults: true });
    this.service = pkg[SERVICE] as grpc.ServiceDefinition;
  }

  /** Returns the message type fullName. */
  type(fullName: string): protobuf.Type {
    return this.root.lookupType(fullName);
  }
}

/** A failed call, with its google.rpc details decoded. */
export class CallError extends Error {
  /**
   * @param code the gRPC status code
   * @param details the status message
   * @param reason ErrorInfo.reason, empty without an ErrorInfo
   * @param metadata ErrorInfo.metadata
   * @param retryDelay RetryInfo.retry_delay in seconds, null without a RetryInfo
   */
  constructor(
    readonly code: grpc.status,
    readonly details: string,
    readonly reason: string,
    readonly metadata: Record<string, string>,
    readonly retryDelay: number | null,
  ) {
    super(`${grpc.status[code]} ${reason || "(no reason)"}: ${details}`);
  }
}

/** A failure no retry can settle: hand it to a person. */
export class Escalate extends CallError {}

/** Turns a grpc-js error into a CallError with ErrorInfo and RetryInfo read
 * from the grpc-status-details-bin trailer. */
export function decodeError(protos: Protos, err: grpc.ServiceError): CallError {
  let reason = "";
  let metadata: Record<string, string> = {};
  let retryDelay: number | null = null;
  for (const value of err.metadata?.get(STATUS_DETAILS_TRAILER) ?? []) {
    const status = protos.type("google.rpc.Status").decode(value as Buffer) as unknown as {
      details: { type_url: string; value: Uint8Array }[];
    };
    for (const detail of status.details) {
      const name = detail.type_url.slice(detail.type_url.lastIndexOf("/") + 1);
      if (name === "google.rpc.ErrorInfo") {
        const info = protos.type(name).toObject(protos.type(name).decode(detail.value)) as { reason?: string; metadata?: Record<string, string> };
        reason = info.reason ?? "";
        metadata = info.metadata ?? {};
      } else if (name === "google.rpc.RetryInfo") {
        const retry = protos.type(name).toObject(protos.type(name).decode(detail.value), { longs: Number }) as {
          retry_delay?: { seconds?: number; nanos?: number };
        };
        retryDelay = (retry.retry_delay?.seconds ?? 0) + (retry.retry_delay?.nanos ?? 0) / 1e9;
      }
    }
  }
  const Cls = ESCALATE_REASONS.has(reason) ? Escalate : CallError;
  return new Cls(err.code, err.details, reason, metadata, retryDelay);
}

/** Whether a retry with the same key may succeed. */
export function retryable(e: CallError): boolean {
  return RETRY_SAME_KEY_REASONS.has(e.reason) || e.code === grpc.status.UNAVAILABLE;
}

/** What a successful call returns. */
export interface Result {
  /** The response, decoded. */
  response: Record<string, unknown>;
  /** The response as it came over the wire. */
  raw: Buffer;
  /** Whether a stored outcome answered (idempotency-replayed: true). */
  replayed: boolean;
}

/** Calls PaymentsService methods with a key, retrying with the same key. */
export class PaymentsCaller {
  /** [method, key, code] of every attempt, for whoever audits retries. */
  readonly attempts: [string, string | null, string][] = [];
  private readonly client: grpc.Client;

  /**
   * @param target the tool server's address
   * @param protos the descriptor set's types
   * @param maxAttempts attempts per call, the first included
   * @param backoff the first retry's delay in seconds when no RetryInfo says one; doubled each time
   * @param timeout each attempt's deadline in seconds
   */
  constructor(
    target: string,
    protected readonly protos: Protos,
    private readonly maxAttempts = 4,
    private readonly backoff = 0.2,
    private readonly timeout = 5,
  ) {
    this.client = new grpc.Client(target, grpc.credentials.createInsecure());
  }

  /** Calls method with request under key (null: no key). Retries with the same
   * key on retryable errors; throws Escalate or CallError otherwise. */
  async call(method: string, request: Record<string, unknown>, key: string | null): Promise<Result> {
    for (let attempt = 1; ; attempt++) {
      try {
        const result = await this.once(method, request, key);
        this.attempts.push([method, key, "OK"]);
        return result;
      } catch (err) {
        const e = decodeError(this.protos, err as grpc.ServiceError);
        this.attempts.push([method, key, grpc.status[e.code]]);
        if (e instanceof Escalate || !retryable(e) || attempt >= this.maxAttempts) {
          throw e;
        }
        // RetryInfo says when; without it, back off exponentially.
        await this.sleep(e.retryDelay ?? this.backoff * 2 ** (attempt - 1));
      }
    }
  }

  /** Waits seconds before a retry. */
  protected sleep(seconds: number): Promise<void> {
    return new Promise((resolve) => setTimeout(resolve, seconds * 1000));
  }

  /** Makes one attempt: the call with the key in its metadata. */
  protected once(method: string, request: Record<string, unknown>, key: string | null): Promise<Result> {
    const def = this.protos.service[method];
    const metadata = new grpc.Metadata();
    if (key !== null) {
      metadata.set(KEY_HEADER, key);
    }
    let replayed = false;
    return new Promise((resolve, reject) => {
      const call = this.client.makeUnaryRequest<Record<string, unknown>, Buffer>(
        def.path,
        def.requestSerialize,
        (raw: Buffer) => raw, // kept raw, to show a replay is byte-identical
        request,
        metadata,
        { deadline: Date.now() + this.timeout * 1000 },
        (err, raw) => {
          if (err || !raw) {
            reject(err);
            return;
          }
          resolve({ response: def.responseDeserialize(raw) as Record<string, unknown>, raw, replayed });
        },
      );
      call.on("metadata", (header: grpc.Metadata) => {
        replayed = header.get(REPLAYED_HEADER).some((v) => v.toString() === "true");
      });
    });
  }

  /** Closes the connection. */
  close(): void {
    this.client.close();
  }
}

/** Mints the key of one logical action, once; every retry of the action reuses it. */
export function newActionKey(action: string): string {
  return `${action}-${randomUUID()}`;
}

/** Plays a scenario against the payments tool and returns one object per step.
 *
 * "main": a charge, its retry (a replay), a new action, a keyless call and a
 * key reused with other arguments. "store-down": one charge while the Dedupe
 * service is down, retried with the same key until the attempts run out. */
export async function scenario(target: string, protos: Protos, name = "main", backoff = 0.2): Promise<Record<string, unknown>[]> {
  const caller = new PaymentsCaller(target, protos, 3, backoff);
  const steps: Record<string, unknown>[] = [];
  const attempt = async (step: string, key: string | null, request: Record<string, unknown>) => {
    caller.attempts.length = 0;
    let out: Record<string, unknown>;
    try {
      const r = await caller.call("ChargeCard", request, key);
      out = { step, key, code: "OK", replayed: r.replayed, response_hex: r.raw.toString("hex"), charge_id: r.response.charge_id };
    } catch (err) {
      if (!(err instanceof CallError)) {
        throw err;
      }
      out = {
        step, key, code: grpc.status[err.code], reason: err.reason, escalate: err instanceof Escalate,
        retry_delay: err.retryDelay, message: err.details,
      };
    }
    out.attempt_keys = caller.attempts.map(([, k]) => k);
    steps.push(out);
  };
  const request = { customer_id: "cust_ts", amount_cents: 4200 };
  try {
    if (name === "store-down") {
      await attempt("store_down", newActionKey("order-charge"), request);
      return steps;
    }
    const order = newActionKey("order-charge");
    await attempt("charge", order, request);
    // The same action again (a timeout, a framework retry): the same key.
    await attempt("retry", order, request);
    // A new action, even with the same arguments: a new key.
    await attempt("new_action", newActionKey("order-charge"), request);
    await attempt("keyless", null, request);
    // A bug: the first order's key sent with another order's arguments.
    await attempt("reused", order, { customer_id: "cust_ts", amount_cents: 9900 });
    return steps;
  } finally {
    caller.close();
  }
}

function flag(args: string[], name: string, def?: string): string {
  const i = args.indexOf(`--${name}`);
  if (i >= 0 && i + 1 < args.length) {
    return args[i + 1];
  }
  if (def === undefined) {
    throw new Error(`--${name} is required`);
  }
  return def;
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const protos = new Protos(flag(args, "descriptor-set"));
  const steps = await scenario(flag(args, "target", "127.0.0.1:50052"), protos, flag(args, "scenario", "main"), Number(flag(args, "backoff", "0.2")));
  for (const step of steps) {
    console.log(JSON.stringify(step));
  }
}

if (require.main === module) {
  main().catch((err) => {
    console.error(err);
    process.exit(1);
  });
}

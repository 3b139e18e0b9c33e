// got, a generic retrying HTTP client, against an httpgate-gated server, for
// internal/testing/retrytest (go test). It sends each request of a plan in
// order and prints what got returned, as one JSON array on stdout; the Go
// test counts what the server received.
//
//   node got.mjs <plan.json> [module]
//
// module is the got to import: "got" (got 14, the default) or "got16"
// (got 16, npm's current release; package.json installs both).
//
// The plan is [{name, url, headers, body, client}]. client "default" is got
// with its default retry settings, POST added to the methods it retries
// (got leaves POST out because a POST without an Idempotency-Key is not
// safe to retry); "documented" is that plus what docs/gating.md tells an
// HTTP caller to add: retry a 409 only when it carries Retry-After
// (IDEMPOTENCY_IN_FLIGHT).
import { readFileSync } from "node:fs";

const got = (await import(process.argv[3] ?? "got")).default;

const retryPost = { methods: [...got.defaults.options.retry.methods, "POST"] };

const clients = {
  default: got.extend({ retry: retryPost }),
  // The client docs/gating.md shows, as it shows it.
  documented: got.extend({
    retry: {
      methods: [...got.defaults.options.retry.methods, "POST"],
      statusCodes: [...got.defaults.options.retry.statusCodes, 409],
      // IDEMPOTENCY_IN_FLIGHT: a 409 with Retry-After; every other 409 is final.
      calculateDelay: ({ error, retryAfter, computedValue }) =>
        error.response?.statusCode === 409 && !retryAfter ? 0 : computedValue,
    },
  }),
};

const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
const results = [];
for (const step of plan) {
  const client = clients[step.client];
  if (!client) {
    throw new Error(`unknown client ${step.client}`);
  }
  const out = { name: step.name };
  try {
    const res = await client.post(step.url, {
      headers: step.headers,
      body: step.body,
      throwHttpErrors: true,
    });
    Object.assign(out, answer(res));
  } catch (err) {
    if (!err.response) {
      out.error = `${err.name}: ${err.message}`;
    } else {
      Object.assign(out, answer(err.response));
    }
  }
  results.push(out);
}
process.stdout.write(JSON.stringify(results) + "\n");

function answer(res) {
  let reason = "";
  if ((res.headers["content-type"] ?? "").startsWith("application/problem+json")) {
    reason = JSON.parse(res.body).reason ?? "";
  }
  return {
    status: res.statusCode,
    reason,
    retryAfter: res.headers["retry-after"] ?? "",
    replayed: res.headers["idempotency-replayed"] === "true",
    retryCount: res.retryCount,
    body: res.body,
  };
}

// Package retrytest runs a generic retrying HTTP client nobody here wrote,
// got 14 and got 16 (node/, both pinned in its package-lock.json; make npm-ci installs them),
// against an httpgate-gated server on the real Dedupe service and
// PostgreSQL, and counts what the server received: every refusal
// docs/gating.md says to escalate reaches the server once, every refusal it
// says got retries reaches it as often as got's defaults retry, and
// IDEMPOTENCY_IN_FLIGHT is retried by the client the docs show. Under
// CI=true a missing node, got or PostgreSQL fails the test instead of
// skipping it.
package retrytest

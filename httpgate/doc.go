// Package httpgate makes the side-effecting routes of a net/http server run
// once per idempotency key, following the IETF HTTP API working group's
// Idempotency-Key draft (draft-ietf-httpapi-idempotency-key-header): it is
// middleware that reads the Idempotency-Key request header, reserves the key
// with the idemgate Dedupe service, runs the handler once, stores its
// response (status, headers, body) and replays it, byte for byte, to every
// duplicate.
//
//	gate, err := httpgate.New(dedupe, "payments-api",
//		httpgate.WithRoute("POST /charges", httpgate.RoutePolicy{Retention: 24 * time.Hour}))
//	...
//	defer gate.Close(ctx)
//	limits := httpgate.ServerLimits{} // timeouts, connection caps in total and per client
//	srv := limits.Server(gate.Handler(mux))
//	err = srv.Serve(limits.Listener(lis))
//
// Serve it as above: ServerLimits bounds what slow, idle or never-reading
// clients cost the server, as every HTTP listener of this project does.
//
// The protocol is the gRPC interceptor's, through the same core
// (internal/gatecore): Begin, lease renewal while the handler runs, Finish
// or Release retried in the background, a lost Begin followed up,
// FAIL_CLOSED or REEXECUTE after a lost outcome, duplicates that wait for
// an in-flight original (MaxWait), fencing, FinishAfterReply, a
// Reconciler, and the replay cache. The handler runs on a request whose
// context keeps the caller's values but not its cancellation: a client that
// gives up after the handler started never causes a second run; its retry
// waits for the outcome or replays it.
//
// Which requests are gated: the most specific WithRoute pattern (a Go 1.22
// ServeMux pattern) that matches decides, gated with its policy or exempt
// with NotGated; else the method: POST and PATCH by default
// (WithGatedMethods). PUT and DELETE are idempotent by HTTP semantics and
// pass through unless a route gates them.
//
// The key is ParseKey's: the draft's sf-string ("abc", quoted), or a bare
// value taken as written. The fingerprint (Fingerprint) covers the method,
// the route, the request target, the chosen headers and the body, a JSON
// body in RFC 8785 canonical form. The body is read whole before anything
// runs, up to the route's MaxBodyBytes.
//
// Refusals are RFC 9457 problem details (application/problem+json) with
// the stable reason in "reason", a "type" that is the reason's section of
// docs/gating.md (DefaultProblemTypeBase) and, where a retry helps,
// "retry_after" and a Retry-After header. The statuses are chosen for
// generic retrying clients, which retry 408, 429, 500, 502, 503 and 504 and
// honour Retry-After: a refusal a retry settles carries Retry-After, one a
// person must settle gets a status they do not retry (docs/gating.md "What
// an HTTP caller does with each refusal", held to this table by a test):
//
//	400 IDEMPOTENCY_KEY_MISSING         a gated request without Idempotency-Key
//	400 IDEMPOTENCY_KEY_INVALID         not one valid key (two fields, bad sf-string, 256+ bytes, ...)
//	401 IDEMPOTENCY_UNAUTHENTICATED     the TenantFunc refused the request
//	409 IDEMPOTENCY_IN_FLIGHT           the original is still running after MaxWait (Retry-After: retry)
//	409 IDEMPOTENCY_OUTCOME_UNKNOWN     an earlier attempt's outcome was lost (FAIL_CLOSED): escalate
//	413 IDEMPOTENCY_REQUEST_TOO_LARGE   the body is over MaxBodyBytes
//	422 IDEMPOTENCY_KEY_REUSED          the key was first used with a different request: escalate
//	429 IDEMPOTENCY_QUOTA_EXCEEDED      over a Dedupe quota (Retry-After for the rate quota)
//	500 IDEMPOTENCY_STORE_REJECTED      the Dedupe service refused the gate (misconfiguration)
//	500 IDEMPOTENCY_OUTCOME_TYPE_MISMATCH  the stored outcome is not an HTTP response
//	503 IDEMPOTENCY_STORE_UNAVAILABLE   the Dedupe service is down; nothing ran (Retry-After: retry)
//	507 IDEMPOTENCY_RESULT_TOO_LARGE    the action ran but its response was over the stored limit
//
// What a response means: the handler's mark (MarkFinal, MarkRetryable,
// MarkOutcomeUnknown) decides when it set one; else 2xx and 3xx are the outcome,
// stored and replayed; a 4xx (ReplayClientErrors) or 5xx
// (ReplayServerErrors) is stored when the policy says so, else released so
// a retry runs again, or marked unknown when the handler's context had
// already ended. The response is buffered whole: Flush does nothing until
// the handler returns, and Hijack is not offered, so a gated route cannot
// stream. Stored headers leave out the hop-by-hop fields, Date,
// Content-Length and Trailer, and the per-caller fields (Set-Cookie,
// Authorization-Info, Access-Control-*, those of WithPerCallerHeaders),
// which only the first caller gets (docs/gating.md, "Response fields
// stored and replayed").
package httpgate

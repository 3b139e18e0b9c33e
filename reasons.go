package idemgate

// ErrorInfo reasons of the refusals every gate answers (the gRPC
// interceptor, connectgate, httpgate, mcpgate and the MCP bridge). They are
// stable: callers may switch on them (over gRPC: status.FromError, then the
// ErrorInfo detail; over HTTP and MCP the problem's or the result's reason).
const (
	// ReasonKeyMissing: a gated method was called without the
	// idempotency-key metadata. INVALID_ARGUMENT; send a key minted once per
	// logical action.
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyInvalid: the key is empty, longer than 255 bytes, not
	// printable ASCII, starts or ends with a space, or is sent twice with
	// different values. INVALID_ARGUMENT.
	ReasonKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	// ReasonKeyConflict: the idempotency-key metadata and the request's key
	// field carry different keys. INVALID_ARGUMENT; send one, or the same in
	// both.
	ReasonKeyConflict = "IDEMPOTENCY_KEY_CONFLICT"
	// ReasonKeyReused: the key was first used with a different request.
	// FAILED_PRECONDITION; the handler did not run. Use a new key for a new
	// action.
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonInFlight: another call with the key is running now. ABORTED with
	// RetryInfo; retry with the same key to get its outcome.
	ReasonInFlight = "IDEMPOTENCY_IN_FLIGHT"
	// ReasonOutcomeUnknown: an earlier attempt with the key lost its lease
	// before it stored an outcome (the tool server died or hung mid-call), so
	// its side effect may or may not have happened, and the method's
	// on_lost_outcome is FAIL_CLOSED. FAILED_PRECONDITION; nothing runs until
	// an operator resolves the record or a Reconciler settles it.
	ReasonOutcomeUnknown = "IDEMPOTENCY_OUTCOME_UNKNOWN"
	// ReasonResultTooLarge: the action already ran, but its outcome was not
	// stored, only a marker: it was over the size limit (WithMaxOutcomeBytes),
	// or it would have taken this server over its stored-bytes quota on the
	// Dedupe service (-caller-max-bytes). FAILED_PRECONDITION; the handler
	// did not run again. The ErrorInfo metadata "size_bytes" gives the
	// outcome's size, "cause" which it was: "size_limit" or
	// "stored_bytes_quota" (absent from gates of earlier versions).
	ReasonResultTooLarge = "IDEMPOTENCY_RESULT_TOO_LARGE"
	// ReasonStoreUnavailable: the Dedupe service could not be reached or
	// failed. UNAVAILABLE with RetryInfo; the handler did not run (fail
	// closed), so retrying with the same key is safe.
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	// ReasonQuotaExceeded: the Dedupe service refused the reservation
	// because this tool server (its caller) is over a quota: its rate of
	// Begins, its stored records or its stored outcome bytes.
	// RESOURCE_EXHAUSTED; the handler did not run. The ErrorInfo metadata
	// "quota" names the quota; RetryInfo, when present, says when a retry
	// with the same key may get through (the rate quota).
	ReasonQuotaExceeded = "IDEMPOTENCY_QUOTA_EXCEEDED"
	// ReasonStoreRejected: the Dedupe service refused the gate's
	// request (a misconfiguration, such as a tenant longer than the scope
	// limit). INTERNAL; the handler did not run.
	ReasonStoreRejected = "IDEMPOTENCY_STORE_REJECTED"
	// ReasonOutcomeTypeMismatch: the stored outcome is not of the method's
	// response type (the method's response type changed within the
	// retention). INTERNAL; the handler is not run again.
	ReasonOutcomeTypeMismatch = "IDEMPOTENCY_OUTCOME_TYPE_MISMATCH"
)

package gatecore

// ErrorInfo reasons of the errors a gate returns, shared by every front end
// (interceptor and mcpgate re-export them). They are stable.
const (
	// ReasonKeyMissing: a gated call came without an idempotency key.
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyInvalid: the key is not 1 to 255 printable ASCII bytes
	// without edge spaces, or was sent twice with different values.
	ReasonKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	// ReasonKeyConflict: two carriers of the key carry different keys.
	ReasonKeyConflict = "IDEMPOTENCY_KEY_CONFLICT"
	// ReasonKeyReused: the key was first used with a different request.
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonInFlight: another call with the key is still running.
	ReasonInFlight = "IDEMPOTENCY_IN_FLIGHT"
	// ReasonOutcomeUnknown: an earlier attempt stopped before its outcome
	// was stored (FAIL_CLOSED).
	ReasonOutcomeUnknown = "IDEMPOTENCY_OUTCOME_UNKNOWN"
	// ReasonResultTooLarge: the action ran, but its outcome was over the
	// size limit or its caller's stored-bytes quota and only a marker was
	// stored (TooLarge says which).
	ReasonResultTooLarge = "IDEMPOTENCY_RESULT_TOO_LARGE"
	// ReasonStoreUnavailable: the Dedupe service could not be reached.
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	// ReasonQuotaExceeded: the Dedupe service refused the reservation for a
	// quota of this server.
	ReasonQuotaExceeded = "IDEMPOTENCY_QUOTA_EXCEEDED"
	// ReasonStoreRejected: the Dedupe service refused the gate's request.
	ReasonStoreRejected = "IDEMPOTENCY_STORE_REJECTED"
	// ReasonOutcomeTypeMismatch: the stored outcome is not of the type this
	// call answers with.
	ReasonOutcomeTypeMismatch = "IDEMPOTENCY_OUTCOME_TYPE_MISMATCH"
)

// reasonDedupeOutcomeUnreadable is the Dedupe service's ErrorInfo reason
// for a stored outcome sealed with a key it no longer has
// (dedupesvc.ReasonOutcomeUnreadable).
const reasonDedupeOutcomeUnreadable = "DEDUPE_OUTCOME_UNREADABLE"

// reasonDedupeOutcomeTooLarge is the Dedupe service's ErrorInfo reason for
// an outcome over its own size limit (dedupesvc.ReasonOutcomeTooLarge).
const reasonDedupeOutcomeTooLarge = "DEDUPE_OUTCOME_TOO_LARGE"

// reasonDedupeStoreUnavailable is the Dedupe service's ErrorInfo reason for
// a failed or unreachable store (dedupesvc.ReasonStoreUnavailable).
const reasonDedupeStoreUnavailable = "DEDUPE_STORE_UNAVAILABLE"

// metadataReserved and reservedNone are the ErrorInfo metadata of a Begin
// the service knows reserved nothing (dedupesvc.MetadataReserved,
// dedupesvc.ReservedNone).
const (
	metadataReserved = "reserved"
	reservedNone     = "none"
)

package dedupesvc

// ErrorInfo reasons the Dedupe service returns. They are stable: callers may
// switch on them.
const (
	// ReasonInvalidRequest: a request field is missing or out of range;
	// INVALID_ARGUMENT. The ErrorInfo metadata names the field.
	ReasonInvalidRequest = "DEDUPE_REQUEST_INVALID"
	// ReasonOutcomeTooLarge: Finish or Resolve with an outcome over the
	// service's limit; INVALID_ARGUMENT, nothing stored.
	ReasonOutcomeTooLarge = "DEDUPE_OUTCOME_TOO_LARGE"
	// ReasonReservationNotHeld: Finish, Release or Heartbeat from an attempt
	// that does not hold the reservation (taken over by another attempt, or
	// settled: completed, released or resolved); FAILED_PRECONDITION. The
	// stored record is unchanged.
	ReasonReservationNotHeld = "RESERVATION_NOT_HELD"
	// ReasonRecordNotUnknown: Resolve of a record whose outcome is known, or
	// that is still in flight within its lease; FAILED_PRECONDITION. Nothing
	// changed.
	ReasonRecordNotUnknown = "RECORD_NOT_UNKNOWN"
	// ReasonRecordNotFound: Resolve of a key with no live record; NOT_FOUND.
	ReasonRecordNotFound = "RECORD_NOT_FOUND"
	// ReasonRecordNotSettled: AdminService.ForgetRecord without force of a
	// record that is in flight or outcome-unknown; FAILED_PRECONDITION,
	// nothing changed. The ErrorInfo metadata "state" names its state.
	ReasonRecordNotSettled = "RECORD_NOT_SETTLED"
	// ReasonStoreUnsupported: an admin RPC the store cannot serve (a store
	// that is not a Forgetter); UNIMPLEMENTED.
	ReasonStoreUnsupported = "DEDUPE_STORE_UNSUPPORTED"
	// ReasonQuotaExceeded: the caller is over one of its quotas;
	// RESOURCE_EXHAUSTED, nothing stored. The ErrorInfo metadata "quota"
	// names it (rate, records or bytes) and "limit" gives its limit; the rate
	// quota (Begins, Finishes and their outcome bytes) adds RetryInfo (when a
	// token is free). Records and bytes free up
	// only as the caller's records expire and are swept: no RetryInfo.
	ReasonQuotaExceeded = "DEDUPE_QUOTA_EXCEEDED"
	// ReasonOutcomeUnreadable: Begin found a completed record whose sealed
	// outcome cannot be opened: its key id is not in the outcome keys file
	// (-outcome-keys-file: removed too early, or encryption turned off), or
	// the stored bytes do not open for this record (damaged, or copied from
	// another row), or, with encryption on, an outcome stored without it
	// (written before encryption was turned on, or planted) while
	// -outcome-accept-plaintext is off; INTERNAL, logged. The record is never taken for absent,
	// which would run the side effect again: restore the key, or settle the
	// key by hand.
	ReasonOutcomeUnreadable = "DEDUPE_OUTCOME_UNREADABLE"
	// ReasonStoreUnavailable: the database failed or could not be reached;
	// UNAVAILABLE with RetryInfo. Every Dedupe RPC is safe to retry.
	ReasonStoreUnavailable = "DEDUPE_STORE_UNAVAILABLE"
)

// MetadataReserved is the ErrorInfo metadata key of a Begin refused
// DEDUPE_STORE_UNAVAILABLE with the value ReservedNone when the service is
// sure that Begin reserved nothing: the store failed before it sent any
// statement of it (ErrNotSent), and it was the call's first try (no
// grpc-previous-rpc-attempts: an earlier try of a retried call may have
// reserved). A gate then has no lost Begin to follow up. Absent, the
// Begin may have reserved.
const (
	MetadataReserved = "reserved"
	ReservedNone     = "none"
)

package gatecore

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

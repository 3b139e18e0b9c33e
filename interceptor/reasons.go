package interceptor

import "github.com/idemgate/idemgate"

// ErrorInfo reasons of the errors the interceptor returns.
const (
	// Deprecated: use idemgate.ReasonKeyMissing, its home shared by every gate.
	ReasonKeyMissing = idemgate.ReasonKeyMissing
	// Deprecated: use idemgate.ReasonKeyInvalid, its home shared by every gate.
	ReasonKeyInvalid = idemgate.ReasonKeyInvalid
	// Deprecated: use idemgate.ReasonKeyConflict, its home shared by every gate.
	ReasonKeyConflict = idemgate.ReasonKeyConflict
	// Deprecated: use idemgate.ReasonKeyReused, its home shared by every gate.
	ReasonKeyReused = idemgate.ReasonKeyReused
	// Deprecated: use idemgate.ReasonInFlight, its home shared by every gate.
	ReasonInFlight = idemgate.ReasonInFlight
	// Deprecated: use idemgate.ReasonOutcomeUnknown, its home shared by every gate.
	ReasonOutcomeUnknown = idemgate.ReasonOutcomeUnknown
	// Deprecated: use idemgate.ReasonResultTooLarge, its home shared by every gate.
	ReasonResultTooLarge = idemgate.ReasonResultTooLarge
	// Deprecated: use idemgate.ReasonStoreUnavailable, its home shared by every gate.
	ReasonStoreUnavailable = idemgate.ReasonStoreUnavailable
	// Deprecated: use idemgate.ReasonQuotaExceeded, its home shared by every gate.
	ReasonQuotaExceeded = idemgate.ReasonQuotaExceeded
	// Deprecated: use idemgate.ReasonStoreRejected, its home shared by every gate.
	ReasonStoreRejected = idemgate.ReasonStoreRejected
	// Deprecated: use idemgate.ReasonOutcomeTypeMismatch, its home shared by every gate.
	ReasonOutcomeTypeMismatch = idemgate.ReasonOutcomeTypeMismatch
)

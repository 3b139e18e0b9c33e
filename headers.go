package idemgate

// Metadata names the gates read and write, as gRPC metadata keys (lower
// case); HTTP header names are case-insensitive, so the same names serve
// Connect and HTTP (httpgate spells them canonically: Idempotency-Key).
const (
	// KeyHeader is the request metadata that carries the idempotency key.
	KeyHeader = "idempotency-key"
	// ReplayedHeader is the response header set to "true" when the response
	// is a stored outcome replayed instead of a fresh execution.
	ReplayedHeader = "idempotency-replayed"
	// KeyDerivedHeader is the response header set to "true" when a keyless
	// call was deduplicated on its fingerprint (KEYLESS_POLICY_FINGERPRINT).
	KeyDerivedHeader = "idempotency-key-derived"
	// ExpiresAtHeader is the response header, an RFC 3339 UTC time to the
	// millisecond (2026-12-01T11:24:00.349Z, as every gate spells it), until
	// which the outcome is replayed to duplicates: on a replay the record's
	// expires_at as the Dedupe service holds it; on a first execution the
	// time this process sent its outcome to be stored (or, under
	// FINISH_POLICY_AFTER_REPLY, answered) plus the method's retention, by
	// this process's clock. The service counts the retention from when it
	// stored the outcome, a moment later, so the record lives at least that
	// long once stored. A trailer instead when the handler already sent the
	// response headers.
	ExpiresAtHeader = "idempotency-expires-at"
	// OriginalTimeHeader is the response header, an RFC 3339 UTC time to the
	// millisecond, that every answer from a stored outcome carries (a
	// replay, from the Dedupe service or the replay cache): when that
	// outcome was stored, the
	// record's completed_at (from a replay cache entry this process filled
	// with its own Finish: when it sent that Finish).
	OriginalTimeHeader = "idempotency-original-time"
)

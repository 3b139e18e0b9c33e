package dedupesvc

import (
	"context"
	"errors"
	"time"
)

// Store keeps idempotency records. Each method is one short operation that
// commits before it returns; none holds a lock across calls, so the tool's
// handler never runs inside a store transaction.
//
// Implementations translate their driver's errors at this edge: they return
// ErrNotHeld where documented and any other error for a store that failed or
// could not be reached.
type Store interface {
	// Begin reserves (scope, key) for the attempt or reports why it cannot.
	// A record past its expiry counts as absent.
	Begin(ctx context.Context, params BeginParams) (BeginResult, error)

	// Finish stores the outcome of the attempt holding the reservation. It
	// returns nil when the same attempt already finished (the outcome is left
	// as it was) and ErrNotHeld when the attempt does not hold the record.
	Finish(ctx context.Context, params FinishParams) error

	// Release frees the reservation so the next attempt runs. It returns nil
	// when the attempt already released it or the record is gone, and
	// ErrNotHeld when another attempt holds the record or it is completed.
	Release(ctx context.Context, params ReleaseParams) error

	// DeleteExpired deletes up to limit records past their expiry and returns
	// how many it deleted.
	DeleteExpired(ctx context.Context, limit int) (int, error)
}

// ErrNotHeld is returned by Finish and Release when the calling attempt does
// not hold the reservation: another attempt took it over, or it is completed.
var ErrNotHeld = errors.New("dedupesvc: the reservation is not held by this attempt")

// BeginParams are the inputs of Store.Begin.
type BeginParams struct {
	// Scope namespaces Key (method and tenant).
	Scope string
	// Key names one logical action.
	Key string
	// Fingerprint is the SHA-256 of the request.
	Fingerprint []byte
	// AttemptToken identifies the calling attempt.
	AttemptToken string
	// Lease is how long the reservation is held before it counts as abandoned.
	Lease time.Duration
	// Retention is how long the record is kept, counted from Begin and again
	// from Finish.
	Retention time.Duration
}

// BeginState is the answer of Store.Begin.
type BeginState int

const (
	// BeginReserved means the attempt holds the key and runs the side effect.
	BeginReserved BeginState = iota + 1
	// BeginCompleted means an outcome is stored: replay it.
	BeginCompleted
	// BeginInFlight means another attempt holds the key now.
	BeginInFlight
	// BeginFingerprintMismatch means the key was first used with another request.
	BeginFingerprintMismatch
)

// String returns the state's name as logged.
func (s BeginState) String() string {
	switch s {
	case BeginReserved:
		return "reserved"
	case BeginCompleted:
		return "completed"
	case BeginInFlight:
		return "in_flight"
	case BeginFingerprintMismatch:
		return "fingerprint_mismatch"
	default:
		return "unknown"
	}
}

// BeginResult is the output of Store.Begin. Which fields are set depends on
// State.
type BeginResult struct {
	// State says what the caller may do.
	State BeginState
	// Epoch is the reservation's epoch (BeginReserved).
	Epoch int64
	// LeaseExpiresAt is when the reservation counts as abandoned
	// (BeginReserved, BeginInFlight).
	LeaseExpiresAt time.Time
	// Outcome is the stored outcome (BeginCompleted).
	Outcome Outcome
	// CompletedAt is when the outcome was stored (BeginCompleted).
	CompletedAt time.Time
	// ExpiresAt is when the record stops being replayed (BeginCompleted).
	ExpiresAt time.Time
}

// Outcome is a stored google.protobuf.Any, kept as the exact bytes received.
type Outcome struct {
	// TypeURL is the Any's type URL.
	TypeURL string
	// Value is the Any's serialized message.
	Value []byte
}

// FinishParams are the inputs of Store.Finish.
type FinishParams struct {
	// Scope as passed to Begin.
	Scope string
	// Key as passed to Begin.
	Key string
	// AttemptToken as passed to Begin.
	AttemptToken string
	// Epoch as returned by Begin.
	Epoch int64
	// Outcome is the outcome to store.
	Outcome Outcome
}

// ReleaseParams are the inputs of Store.Release.
type ReleaseParams struct {
	// Scope as passed to Begin.
	Scope string
	// Key as passed to Begin.
	Key string
	// AttemptToken as passed to Begin.
	AttemptToken string
	// Epoch as returned by Begin.
	Epoch int64
}

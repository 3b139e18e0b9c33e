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
	// A record past its expiry counts as absent. A reservation the
	// namespace's quotas do not allow (params.MaxRecords, MaxOutcomeBytes)
	// returns a *QuotaError; answering a key that is not free never does.
	Begin(ctx context.Context, params BeginParams) (BeginResult, error)

	// Finish stores the outcome of the attempt holding the reservation, also
	// when its record was meanwhile marked outcome-unknown: the real outcome
	// settles it (unless params.ResolveOnly). It returns nil when the same
	// attempt already finished (the outcome is left as it was) and
	// ErrNotHeld when the attempt does not hold the record. A store that is
	// a QuotaFinisher applies params.MaxOutcomeBytes here too.
	Finish(ctx context.Context, params FinishParams) error

	// Release frees the reservation (in flight or outcome-unknown) so the
	// next attempt runs; with params.OutcomeUnknown it instead marks the
	// in-flight record outcome-unknown at once (waiters are woken, Begin
	// answers BeginOutcomeUnknown until Resolve). It returns nil when the
	// attempt already released it (or marked it unknown) or the record is
	// gone, and ErrNotHeld when another attempt holds the record or it is
	// settled.
	Release(ctx context.Context, params ReleaseParams) error

	// Heartbeat renews the attempt's lease and returns its new end. A record
	// of the attempt's epoch marked outcome-unknown (a duplicate found its
	// lease run out while it was in fact alive) is revived to in flight.
	// It returns ErrNotHeld when another attempt took the record over or it
	// is settled (completed, released or resolved).
	Heartbeat(ctx context.Context, params HeartbeatParams) (time.Time, error)

	// Resolve settles a record whose outcome is unknown (marked so, or in
	// flight with its lease run out): it completes it with params.Complete,
	// or releases it when that is nil, and bumps its epoch so that the
	// attempt that held it is fenced (its Finish, Release and Heartbeat get
	// ErrNotHeld). It returns nil for a retry that already took effect,
	// ErrRecordNotFound for no live record, and ErrNotUnknown for a record
	// in another state.
	Resolve(ctx context.Context, params ResolveParams) error

	// ReleaseLost frees the records that the named attempts hold, in flight
	// (lease running or run out) or marked outcome-unknown (unless
	// params.ResolveOnly), in one transaction: attempts whose Begin's answer
	// was lost, which never ran their side effect. Records another attempt
	// holds, settled ones and absent ones are left alone. It returns how many
	// records it freed; waiters on them are woken as by Release.
	ReleaseLost(ctx context.Context, params ReleaseLostParams) (released int, err error)

	// DeleteExpired deletes up to limit records past their expiry. It
	// returns how many it deleted and which of them were outcome-unknown, so
	// the caller can log each one that was never resolved.
	DeleteExpired(ctx context.Context, limit int) (deleted int, unknown []RecordID, err error)
}

// Resumer is a Store that grants leases a grace after a store outage. A
// holder cut off from the store cannot renew its lease, so a lease must not
// run out merely because the store was away: after MarkResumed, a record's
// lease counts as running until at least one full lease (the length of its
// last Begin or renewal) past the resume, and no Begin takes it over or marks
// it outcome-unknown, and no Resolve settles it, before then.
type Resumer interface {
	// MarkResumed records, by the store's own clock, that the store came back
	// from an outage now. The Dedupe service calls it when it starts (a
	// process that starts has, by definition, been away).
	MarkResumed(ctx context.Context) error
}

// Errors a Store returns for the cases the service answers differently from
// a failed store.
var (
	// ErrNotHeld: Finish, Release or Heartbeat from an attempt that does not
	// hold the reservation: another attempt took it over, or it is settled.
	ErrNotHeld = errors.New("dedupesvc: the reservation is not held by this attempt")
	// ErrNotUnknown: Resolve of a record whose outcome is known or that is
	// still in flight within its lease.
	ErrNotUnknown = errors.New("dedupesvc: the record's outcome is not unknown")
	// ErrRecordNotFound: Resolve of a key with no live record.
	ErrRecordNotFound = errors.New("dedupesvc: no record for the key")
	// ErrNotSent: the store failed before it sent any statement of the
	// operation (it could not connect, or it waits out a backoff after
	// finding the database unreachable), so the operation wrote nothing.
	// Stores mark such errors with NotSent; errors.Is finds it.
	ErrNotSent = errors.New("dedupesvc: the store sent nothing of the operation")
)

// NotSent marks err, a failure of the store, as one that came before any
// statement of the operation was sent (ErrNotSent); nil stays nil. A Begin
// that failed so reserved nothing, and the service tells its caller
// (MetadataReserved), which then has no lost Begin to follow up.
func NotSent(err error) error {
	if err == nil || errors.Is(err, ErrNotSent) {
		return err
	}
	return notSentError{err}
}

type notSentError struct{ error }

func (e notSentError) Unwrap() error { return e.error }

func (e notSentError) Is(target error) bool { return target == ErrNotSent }

// RecordID names one record.
type RecordID struct {
	// Namespace is the authenticated caller's name (Caller.Name), empty
	// without authentication. It is a column of its own and part of the
	// record's unique key, so no scope can reach another caller's records.
	Namespace string
	// Scope namespaces Key within the caller's namespace.
	Scope string
	// Key is the idempotency key.
	Key string
}

// LostOutcome says what Begin does when the previous attempt's lease ran out
// before it stored an outcome.
type LostOutcome int

const (
	// FailClosed marks the record outcome-unknown and answers
	// BeginOutcomeUnknown until it is resolved. The zero value.
	FailClosed LostOutcome = iota
	// Reexecute lets the calling attempt take the reservation over.
	Reexecute
)

// String returns the policy's name as logged.
func (l LostOutcome) String() string {
	if l == Reexecute {
		return "reexecute"
	}
	return "fail_closed"
}

// BeginParams are the inputs of Store.Begin.
type BeginParams struct {
	// Namespace is the calling service (RecordID.Namespace).
	Namespace string
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
	// OnLostOutcome says what to do when the previous attempt's lease ran out
	// without an outcome.
	OnLostOutcome LostOutcome
	// UnknownRetention is how long a record marked outcome-unknown is kept
	// (and keeps blocking its key) when nobody resolves it.
	UnknownRetention time.Duration
	// MaxRecords is the namespace's quota of stored records: a Begin that
	// would add a record to a namespace holding this many returns a
	// *QuotaError (CheckQuota). 0, the zero value, is no limit.
	MaxRecords int64
	// MaxOutcomeBytes is the namespace's quota of stored outcome bytes: a
	// Begin that would reserve for a namespace holding this many returns a
	// *QuotaError. Finish is never refused for it (the handler already
	// ran): it stores a marker instead (FinishParams.OverQuota). 0, the
	// zero value, is no limit.
	MaxOutcomeBytes int64
	// ResolveOnly leaves a record marked outcome-unknown to Resolve: the
	// re-sent Begin of the attempt that held it answers BeginOutcomeUnknown
	// instead of taking its reservation back
	// (WithResolveOnlySettlesUnknown). Defaults to false.
	ResolveOnly bool
	// Peek makes Begin read only: it answers what the record says when that
	// needs no write (completed, in flight within its lease, mismatched,
	// marked unknown), and a zero BeginResult (State 0) when the caller
	// would have to reserve, renew or mark it. The service's shared re-read
	// of a waited-for key uses it. Defaults to false.
	Peek bool
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
	// BeginOutcomeUnknown means an attempt's lease ran out before it stored an
	// outcome; nothing may run until the record is resolved.
	BeginOutcomeUnknown
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
	case BeginOutcomeUnknown:
		return "outcome_unknown"
	default:
		return "unknown"
	}
}

// BeginResult is the output of Store.Begin. Which fields are set depends on
// State.
type BeginResult struct {
	// State says what the caller may do.
	State BeginState
	// Epoch is the reservation's epoch (BeginReserved), or the epoch whose
	// outcome was lost (BeginOutcomeUnknown).
	Epoch int64
	// LeaseExpiresAt is when the reservation counts as abandoned
	// (BeginReserved, BeginInFlight), or when it did (BeginOutcomeUnknown).
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
	// Value is the Any's serialized message, or, with KeyID set, the sealed
	// envelope of it (OutcomeCipher).
	Value []byte
	// KeyID is the id of the key Value is sealed under (the column
	// outcome_key_id); empty, the default, for a plaintext Value.
	KeyID string
}

// FinishParams are the inputs of Store.Finish.
type FinishParams struct {
	// Namespace as passed to Begin.
	Namespace string
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
	// MaxOutcomeBytes is the namespace's quota of stored outcome bytes: when
	// storing Outcome would take the namespace past it, OverQuota is stored
	// in its place (see QuotaFinisher). 0, the zero value, is no limit.
	MaxOutcomeBytes int64
	// OverQuota is what is stored in place of an Outcome over the quota:
	// the ResultTooLarge marker, sealed like Outcome. Without it (the zero
	// value) Outcome is stored whatever the quota.
	OverQuota *Outcome
	// ResolveOnly leaves a record marked outcome-unknown to Resolve: the
	// attempt that held it gets ErrNotHeld (WithResolveOnlySettlesUnknown).
	// Defaults to false: the real outcome settles it.
	ResolveOnly bool
}

// QuotaFinisher is a Store whose Finish checks the byte quota against the
// outcome it stores (FinishParams.MaxOutcomeBytes), in the statement that
// stores it.
type QuotaFinisher interface {
	// FinishWithinQuota is Store.Finish, except that it stores p.OverQuota
	// in place of p.Outcome when the namespace's stored bytes plus
	// p.Outcome's would be over p.MaxOutcomeBytes, and reports whether it
	// did. The namespace's bytes are the store's usage totals (pgstore: as
	// of the last usage compaction).
	FinishWithinQuota(ctx context.Context, p FinishParams) (replaced bool, err error)
}

// FinishChecker is a Store that can tell whether a Finish would be taken
// without being sent the outcome: one short read by primary key. The
// service asks it before sending a large outcome (FinishCheckBytes), so
// that a Finish for a key its caller does not hold costs a read, never a
// megabyte through the store's writers.
type FinishChecker interface {
	// CheckFinish returns ErrNotHeld when p's attempt does not hold its
	// record (Finish would refuse it), done when that attempt's Finish
	// already took effect (a retry: Finish would change nothing), else
	// false and nil. It reads only the record's state, token and epoch.
	CheckFinish(ctx context.Context, p FinishParams) (done bool, err error)
}

// HeldForFinish says what CheckFinish answers for a record read as r
// (found false when there is none): the same conditions as Finish's
// statement and RefusedFinish, in one place for every store.
func HeldForFinish(r Record, found bool, p FinishParams) (done bool, err error) {
	if found && r.AttemptToken == p.AttemptToken && r.Epoch == p.Epoch &&
		(r.State == StateInFlight || (r.State == StateUnknown && !p.ResolveOnly)) {
		return false, nil
	}
	if err := RefusedFinish(r, found, p); err != nil {
		return false, err
	}
	return true, nil
}

// ReleaseParams are the inputs of Store.Release.
type ReleaseParams struct {
	// Namespace as passed to Begin.
	Namespace string
	// Scope as passed to Begin.
	Scope string
	// Key as passed to Begin.
	Key string
	// AttemptToken as passed to Begin.
	AttemptToken string
	// Epoch as returned by Begin.
	Epoch int64
	// OutcomeUnknown says the attempt cannot tell whether its side effect
	// happened: instead of freeing the key, the record becomes
	// outcome-unknown at once, as when a FAIL_CLOSED lease runs out, until
	// Resolve. Defaults to false: free the key.
	OutcomeUnknown bool
	// UnknownRetention is how long a record marked outcome-unknown by this
	// Release is kept at least (the service's unknown retention). Used only
	// with OutcomeUnknown.
	UnknownRetention time.Duration
	// ResolveOnly leaves a record marked outcome-unknown to Resolve: a
	// Release that would free it gets ErrNotHeld
	// (WithResolveOnlySettlesUnknown). Defaults to false.
	ResolveOnly bool
}

// MaxLostBegins is the most attempts one ReleaseLost (and one
// ReleaseLostBegins RPC) names: a batch the store writes in one round trip
// and one commit.
const MaxLostBegins = 500

// ReleaseLostParams are the inputs of Store.ReleaseLost.
type ReleaseLostParams struct {
	// Namespace of every attempt (RecordID.Namespace).
	Namespace string
	// Attempts name the records by scope and key, and their Begins by
	// AttemptToken; 1 to MaxLostBegins, each record named once.
	Attempts []LostAttempt
	// ResolveOnly leaves a record marked outcome-unknown to Resolve
	// (WithResolveOnlySettlesUnknown), as Release does. Defaults to false.
	ResolveOnly bool
}

// LostAttempt names an attempt whose Begin's answer was lost.
type LostAttempt struct {
	// Scope as passed to Begin.
	Scope string
	// Key as passed to Begin.
	Key string
	// AttemptToken as passed to Begin.
	AttemptToken string
}

// HeartbeatParams are the inputs of Store.Heartbeat.
type HeartbeatParams struct {
	// Namespace as passed to Begin.
	Namespace string
	// Scope as passed to Begin.
	Scope string
	// Key as passed to Begin.
	Key string
	// AttemptToken as passed to Begin.
	AttemptToken string
	// Epoch as returned by Begin.
	Epoch int64
	// Lease is how long from now the reservation is held.
	Lease time.Duration
	// ResolveOnly leaves a record marked outcome-unknown to Resolve: the
	// Heartbeat does not revive it and gets ErrNotHeld
	// (WithResolveOnlySettlesUnknown). Defaults to false.
	ResolveOnly bool
}

// ResolveParams are the inputs of Store.Resolve.
type ResolveParams struct {
	// Namespace of the record.
	Namespace string
	// Scope of the record.
	Scope string
	// Key of the record.
	Key string
	// Complete is the outcome to store; nil releases the record instead.
	Complete *Outcome
}

// ID returns the record the params name.
func (p BeginParams) ID() RecordID {
	return RecordID{Namespace: p.Namespace, Scope: p.Scope, Key: p.Key}
}

// ID returns the record the params name.
func (p FinishParams) ID() RecordID {
	return RecordID{Namespace: p.Namespace, Scope: p.Scope, Key: p.Key}
}

// ID returns the record the params name.
func (p ReleaseParams) ID() RecordID {
	return RecordID{Namespace: p.Namespace, Scope: p.Scope, Key: p.Key}
}

// ID returns the record the params name.
func (p HeartbeatParams) ID() RecordID {
	return RecordID{Namespace: p.Namespace, Scope: p.Scope, Key: p.Key}
}

// ID returns the record the params name.
func (p ResolveParams) ID() RecordID {
	return RecordID{Namespace: p.Namespace, Scope: p.Scope, Key: p.Key}
}

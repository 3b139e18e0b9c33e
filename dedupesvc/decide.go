package dedupesvc

import (
	"bytes"
	"context"
	"fmt"
	"time"
)

// Record states as stores keep them.
const (
	// StateInFlight: an attempt holds the reservation.
	StateInFlight = "in_flight"
	// StateCompleted: the outcome is stored.
	StateCompleted = "completed"
	// StateReleased: the attempt gave the key up; the next one may run.
	StateReleased = "released"
	// StateUnknown: a lease ran out without an outcome (FAIL_CLOSED).
	StateUnknown = "unknown"
)

// Record is a stored record as a Store reads it, for DecideBegin.
type Record struct {
	// Fingerprint of the request that first used the key.
	Fingerprint []byte
	// State is one of the State constants.
	State string
	// AttemptToken of the attempt that holds or held the reservation.
	AttemptToken string
	// Epoch of the current or last reservation.
	Epoch int64
	// Outcome is the stored outcome (StateCompleted).
	Outcome Outcome
	// LeaseExpiresAt is when the reservation counts as abandoned.
	LeaseExpiresAt time.Time
	// CompletedAt is when the outcome was stored (StateCompleted).
	CompletedAt time.Time
	// ExpiresAt is when the record counts as absent, an in-flight one's
	// effective lease end if later; see Expiry.
	ExpiresAt time.Time
	// UnknownRetention is how long past its lease's end an in-flight record
	// is kept, outcome-unknown, when its holder never stores an outcome: the
	// unknown retention of a FAIL_CLOSED reservation, 0 for a REEXECUTE one
	// (and for records written before stores kept it).
	UnknownRetention time.Duration
}

// Expiry is when the record counts as absent. An in-flight record of a
// FAIL_CLOSED holder whose lease ran out is outcome-unknown whether or not
// a Begin read it in time: it stays for its UnknownRetention past its lease's
// end, not merely until its ordinary expiry, so a retry after the holder
// died never runs the side effect again, and the sweeper deletes it (with
// its warning) only then. Stores repeat this in their SQL.
func (r Record) Expiry() time.Time {
	if r.State == StateInFlight && r.UnknownRetention > 0 {
		if kept := r.LeaseExpiresAt.Add(r.UnknownRetention); kept.After(r.ExpiresAt) {
			return kept
		}
	}
	return r.ExpiresAt
}

// LostRetention is the unknown retention a reservation made with p keeps
// (Record.UnknownRetention): p.UnknownRetention under FailClosed, 0 under
// Reexecute, whose lost outcomes are taken over instead.
func (p BeginParams) LostRetention() time.Duration {
	if p.OnLostOutcome == Reexecute {
		return 0
	}
	return p.UnknownRetention
}

// NextStep is what a Store does after DecideBegin.
type NextStep int

const (
	// StepAnswer: the record answers Begin.
	StepAnswer NextStep = iota
	// StepReserve: the key is free (absent, expired, released, or abandoned
	// under Reexecute): try the reserving upsert.
	StepReserve
	// StepMarkUnknown: the holder's lease ran out under FailClosed: mark the
	// record unknown (if it still is that in-flight epoch), then answer.
	StepMarkUnknown
	// StepRenew: the calling attempt holds the record (in flight, or marked
	// unknown by a duplicate before it could renew) but its lease ran out
	// and nobody took it over: renew the lease (if it still is that
	// attempt's in-flight epoch), then answer reserved. Never hand an
	// attempt a reservation whose lease already ended: a duplicate could take
	// the key while the attempt believes it holds it.
	StepRenew
)

// DecideBegin turns an existing record into Begin's answer, or into the write
// that must come first. It is the one place the semantics of Begin live; each
// Store reads the record, calls it with its clock's now, and carries out the
// step with statements that repeat the same conditions atomically.
func DecideBegin(r Record, p BeginParams, now time.Time) (BeginResult, NextStep) {
	if !r.Expiry().After(now) {
		return BeginResult{}, StepReserve
	}
	if !bytes.Equal(r.Fingerprint, p.Fingerprint) {
		return BeginResult{State: BeginFingerprintMismatch}, StepAnswer
	}
	switch r.State {
	case StateCompleted:
		return BeginResult{State: BeginCompleted, Outcome: r.Outcome, CompletedAt: r.CompletedAt, ExpiresAt: r.ExpiresAt}, StepAnswer
	case StateUnknown:
		if r.AttemptToken == p.AttemptToken && !p.ResolveOnly {
			// The holder asks again: it never learnt it held the key (its
			// answer was lost, and its re-sent Begin came after the lease),
			// so it never ran its handler. It takes its reservation back,
			// as its heartbeat would, instead of blocking the key forever.
			return BeginResult{}, StepRenew
		}
		return BeginResult{State: BeginOutcomeUnknown, Epoch: r.Epoch, LeaseExpiresAt: r.LeaseExpiresAt}, StepAnswer
	case StateInFlight:
		if r.AttemptToken == p.AttemptToken {
			// The same attempt asks again because it lost the first answer.
			if r.LeaseExpiresAt.After(now) {
				return BeginResult{State: BeginReserved, Epoch: r.Epoch, LeaseExpiresAt: r.LeaseExpiresAt}, StepAnswer
			}
			return BeginResult{}, StepRenew
		}
		if r.LeaseExpiresAt.After(now) {
			return BeginResult{State: BeginInFlight, LeaseExpiresAt: r.LeaseExpiresAt}, StepAnswer
		}
		if p.OnLostOutcome == Reexecute {
			return BeginResult{}, StepReserve
		}
		return BeginResult{}, StepMarkUnknown
	default: // released
		return BeginResult{}, StepReserve
	}
}

// The Refused functions say what a Finish, Release or Resolve that changed
// no record means, from the record as read right after it (found false when
// there is none). Like DecideBegin they keep these semantics in one place
// for every Store.

// RefusedFinish returns nil for a retried Finish that already took effect
// (the stored outcome stays as it was), else ErrNotHeld.
func RefusedFinish(r Record, found bool, p FinishParams) error {
	if found && r.State == StateCompleted && r.AttemptToken == p.AttemptToken && r.Epoch == p.Epoch {
		return nil
	}
	return ErrNotHeld
}

// RefusedRelease returns nil when nothing is held any more by anyone the
// attempt could block (the record is gone) or the attempt's own Release is
// retried (released, or outcome-unknown, with its token and epoch), else
// ErrNotHeld.
func RefusedRelease(r Record, found bool, p ReleaseParams) error {
	if !found {
		return nil
	}
	own := r.AttemptToken == p.AttemptToken && r.Epoch == p.Epoch
	// Under ResolveOnly a plain Release of a record marked unknown did not
	// free it: it is refused, not taken for a retry.
	if own && (r.State == StateReleased || (r.State == StateUnknown && (p.OutcomeUnknown || !p.ResolveOnly))) {
		return nil
	}
	return ErrNotHeld
}

// RefusedResolve returns nil for a retried Resolve that already took effect,
// ErrRecordNotFound for no live record, else ErrNotUnknown.
func RefusedResolve(r Record, found bool, now time.Time, p ResolveParams) error {
	switch {
	case !found || !r.Expiry().After(now):
		return ErrRecordNotFound
	case p.Complete != nil && r.State == StateCompleted && r.Outcome.TypeURL == p.Complete.TypeURL && r.Outcome.KeyID == p.Complete.KeyID && bytes.Equal(r.Outcome.Value, p.Complete.Value):
		return nil
	case p.Complete == nil && r.State == StateReleased:
		return nil
	}
	return ErrNotUnknown
}

// BeginSteps are a store's statements for Begin; RunBegin drives them.
type BeginSteps struct {
	// First, when set, is the first statement of a Begin that is not a Peek:
	// it reserves the key in the same statement when there is no record and
	// the quotas allow a new one, and otherwise reads the record, so that a
	// fresh key and a replay each cost one statement. When it neither
	// reserved nor found a record (the conflicting row is not visible to
	// the statement's snapshot yet, or a quota refused), RunBegin goes on
	// with Read as if First were not set. Defaults to nil: Read first.
	First func(ctx context.Context) (FirstResult, error)
	// Read returns the key's record, whether there is one, and the clock
	// reading DecideBegin judges it by.
	Read func(ctx context.Context) (r Record, found bool, now time.Time, err error)
	// MarkUnknown turns the in-flight record of epoch, read at now, into an
	// outcome-unknown one, and reports whether it did (false: it changed
	// meanwhile).
	MarkUnknown func(ctx context.Context, epoch int64, now time.Time) (bool, error)
	// Reserve runs the reserving upsert and reports whether it took the key
	// (false: another attempt holds it), with the new epoch and lease end.
	Reserve func(ctx context.Context, now time.Time) (epoch int64, leaseExpiresAt time.Time, reserved bool, err error)
	// Renew renews the lease of the calling attempt's in-flight record of
	// epoch for BeginParams.Lease from now, as Heartbeat does, and reports
	// the new lease end and whether it did (false: the record changed
	// meanwhile).
	Renew func(ctx context.Context, epoch int64, now time.Time) (leaseExpiresAt time.Time, renewed bool, err error)
	// Usage returns how many records and outcome bytes the namespace holds,
	// read before a reservation when BeginParams sets a quota. It must be
	// cheap: a lookup, never a count of the namespace's rows.
	Usage func(ctx context.Context) (records, bytes int64, err error)
}

// FirstResult is what BeginSteps.First did.
type FirstResult struct {
	// Reserved: the statement reserved the key; Epoch and LeaseExpiresAt
	// are the new reservation's.
	Reserved       bool
	Epoch          int64
	LeaseExpiresAt time.Time
	// Found: the key has a record, Record, read at Now.
	Found  bool
	Record Record
	Now    time.Time
}

// maxBeginRounds bounds RunBegin's loop of read and write: the record can
// change between the two (it expires, is released, taken or swept), which
// needs one more round, never many; First may use one round more.
const maxBeginRounds = 5

// RunBegin is Begin for any store: read the record, decide, and carry out the
// step, again if the record changed in between. It reads first, so a
// duplicate costs one read and no write.
//
// With steps.First, the first round's read is First's, which also reserves a
// fresh key: a fresh key and a replay cost one statement each, and only the
// transitions that must change an existing record (a takeover, a renewal,
// marking a record unknown) cost more.
func RunBegin(ctx context.Context, p BeginParams, steps BeginSteps) (BeginResult, error) {
	for round := range maxBeginRounds {
		var (
			r     Record
			found bool
			now   time.Time
			err   error
		)
		if round == 0 && steps.First != nil && !p.Peek {
			var first FirstResult
			first, err = steps.First(ctx)
			switch {
			case err != nil:
				return BeginResult{}, err
			case first.Reserved:
				return BeginResult{State: BeginReserved, Epoch: first.Epoch, LeaseExpiresAt: first.LeaseExpiresAt}, nil
			case !first.Found:
				continue // invisible to its snapshot, or over a quota: read again
			}
			r, found, now = first.Record, true, first.Now
		} else {
			r, found, now, err = steps.Read(ctx)
			if err != nil {
				return BeginResult{}, err
			}
		}
		step := StepReserve
		var res BeginResult
		if found {
			res, step = DecideBegin(r, p, now)
		}
		switch {
		case step == StepAnswer:
			return res, nil
		case p.Peek:
			return BeginResult{}, nil
		}
		switch step {
		case StepMarkUnknown:
			marked, err := steps.MarkUnknown(ctx, r.Epoch, now)
			if err != nil {
				return BeginResult{}, err
			}
			if marked {
				return BeginResult{State: BeginOutcomeUnknown, Epoch: r.Epoch, LeaseExpiresAt: r.LeaseExpiresAt}, nil
			}
			continue
		case StepRenew:
			leaseEnd, renewed, err := steps.Renew(ctx, r.Epoch, now)
			if err != nil {
				return BeginResult{}, err
			}
			if renewed {
				return BeginResult{State: BeginReserved, Epoch: r.Epoch, LeaseExpiresAt: leaseEnd}, nil
			}
			continue
		}
		if p.MaxRecords > 0 || p.MaxOutcomeBytes > 0 {
			// Checked before, not in, the reserving upsert: concurrent Begins
			// of one namespace may overshoot a quota by their number, which
			// is fine for a limit against runaway callers.
			records, bytes, err := steps.Usage(ctx)
			if err != nil {
				return BeginResult{}, err
			}
			if err := CheckQuota(p, !found, records, bytes); err != nil {
				return BeginResult{}, err
			}
		}
		epoch, leaseEnd, reserved, err := steps.Reserve(ctx, now)
		if err != nil {
			return BeginResult{}, err
		}
		if reserved {
			return BeginResult{State: BeginReserved, Epoch: epoch, LeaseExpiresAt: leaseEnd}, nil
		}
	}
	return BeginResult{}, fmt.Errorf("dedupesvc: the record of the key kept changing over %d rounds", maxBeginRounds)
}

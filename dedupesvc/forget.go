package dedupesvc

import (
	"context"
	"errors"
)

// Forgetter is a Store that can forget a record for an operator (both
// bundled stores can): AdminServer.ForgetRecord.
type Forgetter interface {
	// ForgetRecord retires the record so the next Begin of its key reserves
	// it as if it were new, and returns the record as it was. Retiring is
	// not deleting: the record becomes released and expired and gets a new,
	// higher epoch, so the key's next reservation gets a higher epoch than
	// any attempt before it (fencing tokens keep growing), and the holder of
	// a forced in-flight record is fenced (its Heartbeat, Finish and Release
	// get ErrNotHeld). The sweeper deletes it later. It returns
	// ErrRecordNotFound when there is no record, and the record with
	// ErrNotSettled when it is in flight or outcome-unknown and p.Force is
	// false. Forgetting a forgotten record changes nothing.
	ForgetRecord(ctx context.Context, p ForgetParams) (StoredRecord, error)
}

// ForgetParams are the inputs of Forgetter.ForgetRecord.
type ForgetParams struct {
	// ID is the record.
	ID RecordID
	// Force forgets an in-flight or outcome-unknown record too. Defaults to
	// false.
	Force bool
}

// ErrNotSettled: ForgetRecord without Force of a record that is in flight
// or outcome-unknown.
var ErrNotSettled = errors.New("dedupesvc: the record is in flight or its outcome is unknown")

// maxForgetRounds bounds RunForget's loop: the record can change between
// the read and the write (it settles, is taken over), which needs one more
// round, never many.
const maxForgetRounds = 4

// RunForget is ForgetRecord for any store. read returns the record; retire
// retires it with one statement that repeats the read's epoch and state
// (and skips a record already released and expired), and reports whether
// it changed it. A record that changed in between is read and judged again.
func RunForget(ctx context.Context, p ForgetParams, read func(context.Context) (StoredRecord, bool, error),
	retire func(context.Context, StoredRecord) (bool, error)) (StoredRecord, error) {
	r, found, err := read(ctx)
	for range maxForgetRounds {
		switch {
		case err != nil:
			return StoredRecord{}, err
		case !found:
			return StoredRecord{}, ErrRecordNotFound
		case !p.Force && (r.State == StateInFlight || r.State == StateUnknown):
			return r, ErrNotSettled
		}
		retired, err := retire(ctx, r)
		if err != nil {
			return StoredRecord{}, err
		}
		if retired {
			return r, nil
		}
		before := r
		r, found, err = read(ctx)
		if err == nil && found && r.Epoch == before.Epoch && r.State == before.State {
			return r, nil // unchanged, so it was skipped as already forgotten
		}
	}
	return StoredRecord{}, errors.New("dedupesvc: the record kept changing while it was being forgotten")
}

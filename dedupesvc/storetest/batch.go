package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
)

// BatchHooks let RunBatchedDuplicates force a store's group commit to write
// many Begins in one transaction.
type BatchHooks struct {
	// Hold blocks the store's writes (a lock held from outside) until the
	// returned function is called.
	Hold func(t *testing.T) (release func())
	// Queued returns how many operations wait for the group commit.
	Queued func() int
	// Writing returns how many operations the group commit writes now.
	Writing func() int
	// Stats returns the group commit's transactions and the operations they
	// carried (GroupCommitStats).
	Stats func() (commits, ops int64)
}

// RunBatchedDuplicates forces concurrent Begins of the same keys into one
// group commit and checks each got the answer it would get alone: the store
// must have one writer for this (its group commit's writers set to 1) and
// batches of at least 20. On a fresh key exactly one attempt reserves; the
// same attempt sent twice gets its reservation twice; other attempts with
// the winner's request are told it is in flight, those with another request
// get a mismatch; every Begin of a completed key replays it. A batch written
// as one statement over one snapshot (each row deciding alone) would
// reserve the fresh key for several attempts.
func RunBatchedDuplicates(t *testing.T, s dedupesvc.Store, hooks BatchHooks) {
	t.Helper()
	// The completed key, before the hold.
	done := begin("done-holder", fpA, long, long)
	done.Key = "done"
	r := mustBegin(t, s, done, dedupesvc.BeginReserved)
	f := finish("done-holder", r.Epoch, outA)
	f.Key = "done"
	if err := s.Finish(ctx, f); err != nil {
		t.Fatal(err)
	}

	release := hooks.Hold(t)
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	// The first Begin finds the writer free and is written alone; it waits
	// on the hold while the rest queue behind it.
	var wg sync.WaitGroup
	blocker := begin("blocker", fpA, long, long)
	blocker.Key = "blocker"
	wg.Go(func() { mustBegin(t, s, blocker, dedupesvc.BeginReserved) })
	deadline := time.Now().Add(30 * time.Second)
	for hooks.Writing() != 1 { // the writer took it
		if time.Now().After(deadline) {
			t.Fatal("the first Begin did not reach the writer within 30s")
		}
		time.Sleep(time.Millisecond)
	}

	type call struct {
		p   dedupesvc.BeginParams
		res dedupesvc.BeginResult
		err error
	}
	var calls []*call
	add := func(key, token string, fp []byte) {
		p := begin(token, fp, long, long)
		p.Key = key
		calls = append(calls, &call{p: p})
	}
	for i := range 8 {
		add("fresh", fmt.Sprint("a", i), fpA)
	}
	add("fresh", "a0", fpA) // the same attempt, sent again
	for i := range 4 {
		add("fresh", fmt.Sprint("b", i), fpB)
	}
	for i := range 6 {
		add("done", fmt.Sprint("c", i), fpA)
	}
	commits0, ops0 := hooks.Stats()
	for _, c := range calls {
		wg.Go(func() { c.res, c.err = s.Begin(ctx, c.p) })
	}
	deadline = time.Now().Add(5 * time.Second)
	for hooks.Queued() < len(calls) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d Begins queued behind the held writer after 5s", hooks.Queued(), len(calls))
		}
		time.Sleep(time.Millisecond)
	}
	release()
	released = true
	wg.Wait()

	commits, ops := hooks.Stats()
	if commits-commits0 != 2 || ops-ops0 != int64(len(calls))+1 {
		t.Fatalf("group commit wrote %d transactions of %d operations; want the blocker alone, then all %d queued Begins in one",
			commits-commits0, ops-ops0, len(calls))
	}
	var (
		winner   *call
		reserved = map[string]int64{}
	)
	for _, c := range calls {
		if c.err != nil {
			t.Fatalf("Begin(%s %s): %v", c.p.Key, c.p.AttemptToken, c.err)
		}
		if c.p.Key == "done" {
			if c.res.State != dedupesvc.BeginCompleted || !bytes.Equal(c.res.Outcome.Value, outA.Value) {
				t.Errorf("Begin(done %s) = %v %q, want the stored outcome", c.p.AttemptToken, c.res.State, c.res.Outcome.Value)
			}
			continue
		}
		if c.res.State == dedupesvc.BeginReserved {
			if e, ok := reserved[c.p.AttemptToken]; ok && e != c.res.Epoch {
				t.Errorf("attempt %s reserved twice with epochs %d and %d", c.p.AttemptToken, e, c.res.Epoch)
			}
			reserved[c.p.AttemptToken] = c.res.Epoch
			winner = c
		}
	}
	if len(reserved) != 1 {
		t.Fatalf("attempts %v reserved the fresh key, want exactly one", reserved)
	}
	for _, c := range calls {
		if c.p.Key != "fresh" {
			continue
		}
		want := dedupesvc.BeginInFlight
		switch {
		case c.p.AttemptToken == winner.p.AttemptToken:
			want = dedupesvc.BeginReserved
		case !bytes.Equal(c.p.Fingerprint, winner.p.Fingerprint):
			want = dedupesvc.BeginFingerprintMismatch
		}
		if c.res.State != want {
			t.Errorf("Begin(fresh %s) = %v, want %v (the key is %s's)", c.p.AttemptToken, c.res.State, want, winner.p.AttemptToken)
		}
	}
}

// RunBatchedFailures forces Begins into one group commit beside operations
// that fail: a Begin its namespace's quota refuses, and bad (when not nil),
// an operation the store itself must refuse with an error (a row its schema
// rejects). Each must get its own error and every other Begin of the batch
// its reservation: one caller's bad row must not fail the others. The store
// must have one writer and batches of at least 12.
func RunBatchedFailures(t *testing.T, s dedupesvc.Store, hooks BatchHooks, bad func() error) {
	t.Helper()
	// The namespace "full" holds one record, its quota.
	full := begin("full-holder", fpA, long, long)
	full.Namespace, full.Key = "full", "first"
	mustBegin(t, s, full, dedupesvc.BeginReserved)
	settleUsage(t, s)

	release := hooks.Hold(t)
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	var wg sync.WaitGroup
	blocker := begin("blocker", fpA, long, long)
	blocker.Key = "blocker"
	wg.Go(func() { mustBegin(t, s, blocker, dedupesvc.BeginReserved) })
	deadline := time.Now().Add(30 * time.Second)
	for hooks.Writing() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the first Begin did not reach the writer within 30s")
		}
		time.Sleep(time.Millisecond)
	}

	commits0, ops0 := hooks.Stats()
	queued := 0
	results := make([]error, 10)
	for i := range results {
		queued++
		wg.Go(func() {
			p := begin(fmt.Sprint("t", i), fpA, long, long)
			p.Key = fmt.Sprint("key-", i)
			res, err := s.Begin(ctx, p)
			if err == nil && res.State != dedupesvc.BeginReserved {
				err = fmt.Errorf("Begin = %v, want reserved", res.State)
			}
			results[i] = err
		})
	}
	var refused error
	queued++
	wg.Go(func() {
		p := begin("over", fpA, long, long)
		p.Namespace, p.Key, p.MaxRecords = "full", "second", 1
		_, refused = s.Begin(ctx, p)
	})
	var badErr error
	if bad != nil {
		queued++
		wg.Go(func() { badErr = bad() })
	}
	deadline = time.Now().Add(5 * time.Second)
	for hooks.Queued() < queued {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d operations queued behind the held writer after 5s", hooks.Queued(), queued)
		}
		time.Sleep(time.Millisecond)
	}
	release()
	released = true
	wg.Wait()

	if commits, ops := hooks.Stats(); commits-commits0 < 2 || ops-ops0 < int64(queued)+1 {
		t.Fatalf("group commit wrote %d transactions of %d operations; want the %d queued ones batched behind the blocker", commits-commits0, ops-ops0, queued)
	}
	if !errors.Is(refused, dedupesvc.ErrQuotaExceeded) {
		t.Errorf("Begin over the namespace's quota: %v, want a quota error", refused)
	}
	if bad != nil && badErr == nil {
		t.Error("the bad operation succeeded, want its error")
	}
	for i, err := range results {
		if err != nil {
			t.Errorf("Begin of key-%d beside the failing operations: %v", i, err)
		}
	}
	// And the reservations are stored: each key is held by its attempt.
	for i := range results {
		p := begin("someone-else", fpA, long, long)
		p.Key = fmt.Sprint("key-", i)
		mustBegin(t, s, p, dedupesvc.BeginInFlight)
	}
}

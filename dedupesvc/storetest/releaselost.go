package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
)

// lostAttempt names key's record and the attempt token that Began it.
func lostAttempt(key, token string) dedupesvc.LostAttempt {
	return dedupesvc.LostAttempt{Scope: "/pkg.S/M", Key: key, AttemptToken: token}
}

func beginKey(key, token string, fp []byte, lease time.Duration) dedupesvc.BeginParams {
	p := begin(token, fp, lease, long)
	p.Key = key
	return p
}

func testReleaseLost(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()

	t.Run("frees what each lost attempt holds, in flight or run out, and nothing else", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		mustBegin(t, s, beginKey("running", "lost-1", fpA, long), dedupesvc.BeginReserved)
		mustBegin(t, s, beginKey("lapsed", "lost-2", fpA, short), dedupesvc.BeginReserved)
		other := mustBegin(t, s, beginKey("others", "holder", fpA, long), dedupesvc.BeginReserved)
		done := mustBegin(t, s, beginKey("done", "lost-4", fpA, long), dedupesvc.BeginReserved)
		f := finish("lost-4", done.Epoch, outA)
		f.Key = "done"
		if err := s.Finish(ctx, f); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * short)
		n, err := s.ReleaseLost(ctx, dedupesvc.ReleaseLostParams{Attempts: []dedupesvc.LostAttempt{
			lostAttempt("running", "lost-1"), lostAttempt("lapsed", "lost-2"), lostAttempt("others", "lost-3"),
			lostAttempt("done", "lost-4"), lostAttempt("absent", "lost-5"),
		}})
		if err != nil || n != 2 {
			t.Fatalf("ReleaseLost = %d, %v; want the 2 records the lost attempts held", n, err)
		}
		for _, key := range []string{"running", "lapsed"} {
			mustBegin(t, s, beginKey(key, "next-"+key, fpA, long), dedupesvc.BeginReserved)
		}
		mustBegin(t, s, beginKey("others", "next", fpA, long), dedupesvc.BeginInFlight)
		mustBegin(t, s, beginKey("done", "next", fpA, long), dedupesvc.BeginCompleted)
		r := release("holder", other.Epoch)
		r.Key = "others"
		if err := s.Release(ctx, r); err != nil {
			t.Fatalf("the untouched holder's Release: %v", err)
		}
		if n, err := s.ReleaseLost(ctx, dedupesvc.ReleaseLostParams{Attempts: []dedupesvc.LostAttempt{lostAttempt("running", "lost-1")}}); err != nil || n != 0 {
			t.Fatalf("ReleaseLost retried after another attempt reserved = %d, %v; want 0, nil: that attempt is not touched", n, err)
		}
		mustBegin(t, s, beginKey("running", "third", fpA, long), dedupesvc.BeginInFlight)
	})

	t.Run("frees a lost attempt's record marked unknown, unless left to Resolve", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for _, key := range []string{"free", "kept"} {
			mustBegin(t, s, beginKey(key, "lost-"+key, fpA, short), dedupesvc.BeginReserved)
		}
		time.Sleep(2 * short)
		for _, key := range []string{"free", "kept"} {
			mustBegin(t, s, beginKey(key, "duplicate", fpA, long), dedupesvc.BeginOutcomeUnknown)
		}
		n, err := s.ReleaseLost(ctx, dedupesvc.ReleaseLostParams{ResolveOnly: true, Attempts: []dedupesvc.LostAttempt{lostAttempt("kept", "lost-kept")}})
		if err != nil || n != 0 {
			t.Fatalf("ReleaseLost under ResolveOnly = %d, %v; want 0, nil", n, err)
		}
		mustBegin(t, s, beginKey("kept", "duplicate", fpA, long), dedupesvc.BeginOutcomeUnknown)
		n, err = s.ReleaseLost(ctx, dedupesvc.ReleaseLostParams{Attempts: []dedupesvc.LostAttempt{lostAttempt("free", "lost-free")}})
		if err != nil || n != 1 {
			t.Fatalf("ReleaseLost of a record marked unknown = %d, %v; want 1, nil", n, err)
		}
		mustBegin(t, s, beginKey("free", "duplicate", fpA, long), dedupesvc.BeginReserved)
	})

	t.Run("a lost attempt's record resolved meanwhile stays resolved", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		mustBegin(t, s, beginKey("resolved", "lost", fpA, short), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		if err := s.Resolve(ctx, dedupesvc.ResolveParams{Scope: "/pkg.S/M", Key: "resolved", Complete: &outA}); err != nil {
			t.Fatal(err)
		}
		if n, err := s.ReleaseLost(ctx, dedupesvc.ReleaseLostParams{Attempts: []dedupesvc.LostAttempt{lostAttempt("resolved", "lost")}}); err != nil || n != 0 {
			t.Fatalf("ReleaseLost after Resolve = %d, %v; want 0, nil", n, err)
		}
		mustBegin(t, s, beginKey("resolved", "next", fpA, long), dedupesvc.BeginCompleted)
	})

	t.Run("a crowd in one call, and in concurrent calls", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		const crowd = dedupesvc.MaxLostBegins
		attempts := make([]dedupesvc.LostAttempt, crowd)
		for i := range attempts {
			attempts[i] = lostAttempt(fmt.Sprintf("crowd-%03d", i), fmt.Sprintf("lost-%03d", i))
			mustBegin(t, s, beginKey(attempts[i].Key, attempts[i].AttemptToken, fpA, long), dedupesvc.BeginReserved)
		}
		// Two overlapping calls in opposite orders, as two replicas may get
		// them, must neither deadlock nor free a record twice.
		reversed := make([]dedupesvc.LostAttempt, crowd)
		for i, a := range attempts {
			reversed[crowd-1-i] = a
		}
		counts := make(chan int, 2)
		errs := make(chan error, 2)
		for _, batch := range [][]dedupesvc.LostAttempt{attempts, reversed} {
			go func() {
				n, err := s.ReleaseLost(ctx, dedupesvc.ReleaseLostParams{Attempts: batch})
				counts <- n
				errs <- err
			}()
		}
		total := 0
		for range 2 {
			total += <-counts
			if err := <-errs; err != nil {
				t.Fatalf("ReleaseLost: %v", err)
			}
		}
		if total != crowd {
			t.Fatalf("two overlapping ReleaseLost calls freed %d records in all, want %d: each once", total, crowd)
		}
		for _, a := range attempts {
			mustBegin(t, s, beginKey(a.Key, "next", fpA, long), dedupesvc.BeginReserved)
		}
	})

	t.Run("a namespace frees only its own records", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		p := beginKey("mine", "lost", fpA, long)
		p.Namespace = "tenant-a"
		mustBegin(t, s, p, dedupesvc.BeginReserved)
		n, err := s.ReleaseLost(ctx, dedupesvc.ReleaseLostParams{Namespace: "tenant-b", Attempts: []dedupesvc.LostAttempt{lostAttempt("mine", "lost")}})
		if err != nil || n != 0 {
			t.Fatalf("another namespace's ReleaseLost = %d, %v; want 0, nil", n, err)
		}
		p.AttemptToken = "next"
		mustBegin(t, s, p, dedupesvc.BeginInFlight)
	})
}

package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
)

// replayStore returns a fresh store as the Inspector and ReplayCounter the
// cases need, or skips a store that is not both.
func replayStore(t *testing.T, newStore func(*testing.T) dedupesvc.Store) (dedupesvc.Store, dedupesvc.Inspector, dedupesvc.ReplayCounter) {
	s, inspector := newInspector(t, newStore)
	counter, ok := s.(dedupesvc.ReplayCounter)
	if !ok {
		t.Skip("the store does not count replays")
	}
	return s, inspector, counter
}

// completedKey completes key with outA and returns the record, whose
// CompletedAt is what Begin answers a duplicate.
func completedKey(t *testing.T, s dedupesvc.Store, inspector dedupesvc.Inspector, key string, retention time.Duration) dedupesvc.StoredRecord {
	t.Helper()
	p := begin("t-"+key, fpA, min(retention, long), retention)
	p.Key = key
	r := mustBegin(t, s, p, dedupesvc.BeginReserved)
	f := finish("t-"+key, r.Epoch, outA)
	f.Key = key
	if err := s.Finish(ctx, f); err != nil {
		t.Fatal(err)
	}
	return mustGet(t, inspector, idOf(key))
}

func idOf(key string) dedupesvc.RecordID { return dedupesvc.RecordID{Scope: "/pkg.S/M", Key: key} }

func mustGet(t *testing.T, inspector dedupesvc.Inspector, id dedupesvc.RecordID) dedupesvc.StoredRecord {
	t.Helper()
	r, found, err := inspector.GetRecord(ctx, id)
	if err != nil || !found {
		t.Fatalf("GetRecord(%s) = found %v, %v", id.Key, found, err)
	}
	return r
}

func addReplays(t *testing.T, counter dedupesvc.ReplayCounter, want int, counts ...dedupesvc.ReplayCount) {
	t.Helper()
	n, err := counter.AddReplays(ctx, counts)
	if err != nil || n != want {
		t.Fatalf("AddReplays(%d counts) = %d, %v; want %d records changed", len(counts), n, err, want)
	}
}

func testReplayCounts(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()

	t.Run("counts add up per record and date the last replay", func(t *testing.T) {
		t.Parallel()
		s, inspector, counter := replayStore(t, newStore)
		replay := completedKey(t, s, inspector, "k1", long)
		completedKey(t, s, inspector, "k2", long)
		if r := mustGet(t, inspector, idOf("k2")); r.ReplayCount != 0 || !r.LastReplayedAt.IsZero() || r.ReplayAge() != 0 {
			t.Fatalf("a record never counted: %d replays, last %v; want 0 and none", r.ReplayCount, r.LastReplayedAt)
		}
		addReplays(t, counter, 1, dedupesvc.ReplayCount{ID: idOf("k1"), CompletedAt: replay.CompletedAt, Count: 2})
		first := mustGet(t, inspector, idOf("k1"))
		addReplays(t, counter, 1, dedupesvc.ReplayCount{ID: idOf("k1"), CompletedAt: replay.CompletedAt, Count: 3})
		r := mustGet(t, inspector, idOf("k1"))
		if r.ReplayCount != 5 {
			t.Fatalf("after counts of 2 and 3: %d replays, want 5", r.ReplayCount)
		}
		if r.LastReplayedAt.Before(first.LastReplayedAt) || r.LastReplayedAt.Before(r.CompletedAt) || r.ReplayAge() < 0 {
			t.Fatalf("last replayed at %v (first flush %v), completed at %v: want the later flush's, after completion", r.LastReplayedAt, first.LastReplayedAt, r.CompletedAt)
		}
		if r2 := mustGet(t, inspector, idOf("k2")); r2.ReplayCount != 0 {
			t.Fatalf("the other record counts %d replays, want 0", r2.ReplayCount)
		}
	})

	t.Run("a late count never moves the last replay back", func(t *testing.T) {
		t.Parallel()
		s, inspector, counter := replayStore(t, newStore)
		replay := completedKey(t, s, inspector, "k1", long)
		time.Sleep(2 * short)
		addReplays(t, counter, 1, dedupesvc.ReplayCount{ID: idOf("k1"), CompletedAt: replay.CompletedAt, Count: 1})
		latest := mustGet(t, inspector, idOf("k1")).LastReplayedAt
		// Another replica's count of replays served before.
		addReplays(t, counter, 1, dedupesvc.ReplayCount{ID: idOf("k1"), CompletedAt: replay.CompletedAt, Count: 1, Since: short})
		if r := mustGet(t, inspector, idOf("k1")); r.ReplayCount != 2 || r.LastReplayedAt.Before(latest) {
			t.Fatalf("%d replays, last %v; want 2, last at least %v", r.ReplayCount, r.LastReplayedAt, latest)
		}
	})

	t.Run("counts of another outcome, or of no record, are dropped", func(t *testing.T) {
		t.Parallel()
		s, inspector, counter := replayStore(t, newStore)
		replay := completedKey(t, s, inspector, "k1", long)
		addReplays(t, counter, 0,
			dedupesvc.ReplayCount{ID: idOf("k1"), CompletedAt: replay.CompletedAt.Add(-time.Second), Count: 7},
			dedupesvc.ReplayCount{ID: idOf("absent"), CompletedAt: replay.CompletedAt, Count: 7},
			dedupesvc.ReplayCount{ID: dedupesvc.RecordID{Namespace: "svc-other", Scope: "/pkg.S/M", Key: "k1"}, CompletedAt: replay.CompletedAt, Count: 7})
		if r := mustGet(t, inspector, idOf("k1")); r.ReplayCount != 0 {
			t.Fatalf("%d replays, want 0: none of the counts was for this outcome", r.ReplayCount)
		}
		if n, err := counter.AddReplays(ctx, nil); err != nil || n != 0 {
			t.Fatalf("AddReplays(nil) = %d, %v", n, err)
		}
	})

	t.Run("a key used anew counts from zero", func(t *testing.T) {
		t.Parallel()
		s, inspector, counter := replayStore(t, newStore)
		replay := completedKey(t, s, inspector, "k1", short)
		addReplays(t, counter, 1, dedupesvc.ReplayCount{ID: idOf("k1"), CompletedAt: replay.CompletedAt, Count: 4})
		time.Sleep(2 * short) // the record expires; its key is free again
		again := completedKey(t, s, inspector, "k1", long)
		if r := mustGet(t, inspector, idOf("k1")); r.ReplayCount != 0 || !r.LastReplayedAt.IsZero() {
			t.Fatalf("the key's new outcome shows %d replays (last %v) of its old one; want 0", r.ReplayCount, r.LastReplayedAt)
		}
		if list, err := inspector.ListRecords(ctx, dedupesvc.ListQuery{Order: dedupesvc.OrderReplays, Limit: 10}); err != nil || len(list) != 0 {
			t.Fatalf("replay listing = %d records, %v; want none", len(list), err)
		}
		addReplays(t, counter, 1, dedupesvc.ReplayCount{ID: idOf("k1"), CompletedAt: again.CompletedAt, Count: 1})
		if r := mustGet(t, inspector, idOf("k1")); r.ReplayCount != 1 {
			t.Fatalf("%d replays, want 1", r.ReplayCount)
		}
	})

	t.Run("listings by replays and by replay age, page by page", func(t *testing.T) {
		t.Parallel()
		s, inspector, counter := replayStore(t, newStore)
		// k-old completes well before the others, so once all are replayed
		// in one flush it has the longest replay age.
		replays := map[string]dedupesvc.StoredRecord{"k-old": completedKey(t, s, inspector, "k-old", long)}
		time.Sleep(2 * short)
		for _, key := range []string{"k-a", "k-b", "k-c", "k-d", "k-never"} {
			replays[key] = completedKey(t, s, inspector, key, long)
		}
		var counts []dedupesvc.ReplayCount
		for key, n := range map[string]int64{"k-old": 1, "k-a": 5, "k-b": 3, "k-c": 5, "k-d": 2} {
			counts = append(counts, dedupesvc.ReplayCount{ID: idOf(key), CompletedAt: replays[key].CompletedAt, Count: n})
		}
		addReplays(t, counter, 5, counts...)

		list := func(q dedupesvc.ListQuery) (keys []string) {
			t.Helper()
			for {
				page, err := inspector.ListRecords(ctx, q)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range page {
					keys = append(keys, fmt.Sprintf("%s:%d", r.ID.Key, r.ReplayCount))
				}
				if len(page) < q.Limit {
					return keys
				}
				after := dedupesvc.PositionOf(page[len(page)-1])
				q.After = &after
			}
		}
		byReplays := list(dedupesvc.ListQuery{Order: dedupesvc.OrderReplays, Limit: 100})
		if want := "[k-a:5 k-c:5 k-b:3 k-d:2 k-old:1]"; fmt.Sprint(byReplays) != want {
			t.Fatalf("by replays: %v, want %s (never-replayed records left out)", byReplays, want)
		}
		if paged := list(dedupesvc.ListQuery{Order: dedupesvc.OrderReplays, Limit: 2}); fmt.Sprint(paged) != fmt.Sprint(byReplays) {
			t.Fatalf("by replays, pages of 2: %v, want %v", paged, byReplays)
		}
		byAge := list(dedupesvc.ListQuery{Order: dedupesvc.OrderReplayAge, Limit: 100})
		if len(byAge) != 5 || byAge[0] != "k-old:1" {
			t.Fatalf("by replay age: %v, want the 5 replayed records, k-old first", byAge)
		}
		if paged := list(dedupesvc.ListQuery{Order: dedupesvc.OrderReplayAge, Limit: 2}); fmt.Sprint(paged) != fmt.Sprint(byAge) {
			t.Fatalf("by replay age, pages of 2: %v, want %v", paged, byAge)
		}
		if inFlight := list(dedupesvc.ListQuery{Order: dedupesvc.OrderReplays, State: dedupesvc.StateInFlight, Limit: 10}); len(inFlight) != 0 {
			t.Fatalf("replayed records in flight: %v, want none", inFlight)
		}
	})
}

func testForget(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()
	forgetter := func(t *testing.T) (dedupesvc.Store, dedupesvc.Inspector, dedupesvc.Forgetter) {
		s, inspector := newInspector(t, newStore)
		f, ok := s.(dedupesvc.Forgetter)
		if !ok {
			t.Skip("the store cannot forget records")
		}
		return s, inspector, f
	}
	forget := func(force bool) dedupesvc.ForgetParams {
		return dedupesvc.ForgetParams{ID: idOf("key-1"), Force: force}
	}

	t.Run("a completed record is forgotten: the key runs again, with a higher epoch", func(t *testing.T) {
		t.Parallel()
		s, inspector, f := forgetter(t)
		r := completed(t, s, outA)
		before, err := f.ForgetRecord(ctx, forget(false))
		if err != nil || before.State != dedupesvc.StateCompleted || before.Epoch != r.Epoch {
			t.Fatalf("ForgetRecord = %+v, %v; want the completed record as it was", before, err)
		}
		if again, err := f.ForgetRecord(ctx, forget(false)); err != nil || again.State != dedupesvc.StateReleased {
			t.Fatalf("forgetting it again = %+v, %v; want the forgotten record, no error", again, err)
		}
		// Even another request may use the key now.
		next := mustBegin(t, s, begin("t-next", fpB, long, long), dedupesvc.BeginReserved)
		if next.Epoch <= r.Epoch {
			t.Fatalf("the key's next reservation has epoch %d, want above %d: fencing tokens must keep growing", next.Epoch, r.Epoch)
		}
		if got := mustGet(t, inspector, idOf("key-1")); got.State != dedupesvc.StateInFlight || got.Epoch != next.Epoch {
			t.Fatalf("after the new Begin: %+v", got)
		}
	})

	t.Run("an in-flight record is refused unless forced, and its holder is fenced", func(t *testing.T) {
		t.Parallel()
		s, _, f := forgetter(t)
		r := mustBegin(t, s, begin("holder", fpA, long, long), dedupesvc.BeginReserved)
		got, err := f.ForgetRecord(ctx, forget(false))
		if !errors.Is(err, dedupesvc.ErrNotSettled) || got.State != dedupesvc.StateInFlight {
			t.Fatalf("ForgetRecord without force = %+v, %v; want ErrNotSettled and the in-flight record", got, err)
		}
		if _, err := s.Heartbeat(ctx, heartbeat("holder", r.Epoch)); err != nil {
			t.Fatalf("the holder's heartbeat after a refused forget: %v", err)
		}
		if _, err := f.ForgetRecord(ctx, forget(true)); err != nil {
			t.Fatalf("forced ForgetRecord: %v", err)
		}
		if _, err := s.Heartbeat(ctx, heartbeat("holder", r.Epoch)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("the holder's heartbeat after a forced forget: %v, want ErrNotHeld", err)
		}
		if err := s.Finish(ctx, finish("holder", r.Epoch, outA)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("the holder's Finish after a forced forget: %v, want ErrNotHeld", err)
		}
		if next := mustBegin(t, s, begin("t-dup", fpA, long, long), dedupesvc.BeginReserved); next.Epoch <= r.Epoch {
			t.Fatalf("a duplicate's reservation has epoch %d, want above the holder's %d", next.Epoch, r.Epoch)
		}
	})

	t.Run("an outcome-unknown record is refused unless forced", func(t *testing.T) {
		t.Parallel()
		s, _, f := forgetter(t)
		mustBegin(t, s, begin("crashed", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginOutcomeUnknown)
		if got, err := f.ForgetRecord(ctx, forget(false)); !errors.Is(err, dedupesvc.ErrNotSettled) || got.State != dedupesvc.StateUnknown {
			t.Fatalf("ForgetRecord without force = %+v, %v; want ErrNotSettled", got, err)
		}
		if _, err := f.ForgetRecord(ctx, forget(true)); err != nil {
			t.Fatal(err)
		}
		mustBegin(t, s, begin("t3", fpA, long, long), dedupesvc.BeginReserved)
	})

	t.Run("no record, or another namespace's, is not found", func(t *testing.T) {
		t.Parallel()
		s, _, f := forgetter(t)
		if _, err := f.ForgetRecord(ctx, forget(true)); !errors.Is(err, dedupesvc.ErrRecordNotFound) {
			t.Fatalf("ForgetRecord of no record: %v, want ErrRecordNotFound", err)
		}
		completed(t, s, outA)
		other := forget(true)
		other.ID.Namespace = "svc-other"
		if _, err := f.ForgetRecord(ctx, other); !errors.Is(err, dedupesvc.ErrRecordNotFound) {
			t.Fatalf("ForgetRecord in another namespace: %v, want ErrRecordNotFound", err)
		}
		mustBegin(t, s, begin("t-dup", fpA, long, long), dedupesvc.BeginCompleted)
	})
}

// Package storetest is the conformance suite every dedupesvc.Store
// implementation must pass: reservation, replay, mismatch, fencing, expiry,
// release, heartbeats, outcome-unknown, Resolve and sweeping, with the
// concurrency cases, written once against the interface.
//
// An implementation's test calls Run with a function that returns a fresh,
// empty store for each case:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) dedupesvc.Store { return pgstore.New(pgtest.Pool(t)) })
//	}
package storetest

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
)

// Run runs the whole suite; newStore returns a fresh, empty store and
// arranges its cleanup with t.Cleanup. The cases run in parallel, each on
// its own store. Leases and retentions in the suite are 150ms to 1s, so a
// store's clock must have millisecond resolution.
func Run(t *testing.T, newStore func(t *testing.T) dedupesvc.Store) {
	RunWithNotifier(t, newStore, nil)
}

// RunWithNotifier is Run with the Dedupe service's Notifier for a store
// (nil: the store itself when it is one, else none), for the cases that
// run the service over the store.
func RunWithNotifier(t *testing.T, newStore func(t *testing.T) dedupesvc.Store, notifier func(t *testing.T, s dedupesvc.Store) dedupesvc.Notifier) {
	if notifier == nil {
		notifier = func(_ *testing.T, s dedupesvc.Store) dedupesvc.Notifier {
			n, _ := s.(dedupesvc.Notifier)
			return n
		}
	}
	t.Run("Begin", func(t *testing.T) { testBegin(t, newStore) })
	t.Run("BeginConcurrent", func(t *testing.T) { testBeginConcurrent(t, newStore) })
	t.Run("Finish", func(t *testing.T) { testFinish(t, newStore) })
	t.Run("Release", func(t *testing.T) { testRelease(t, newStore) })
	t.Run("ReleaseLost", func(t *testing.T) { testReleaseLost(t, newStore) })
	t.Run("SweeperDeletesExpiredInBatches", func(t *testing.T) { testSweeperDeletesExpiredInBatches(t, newStore) })
	t.Run("SweeperPassesLiveRowsPastTheirExpiry", func(t *testing.T) { testSweeperPassesLiveRows(t, newStore) })
	t.Run("LostOutcome", func(t *testing.T) { testLostOutcome(t, newStore) })
	t.Run("Resolve", func(t *testing.T) { testResolve(t, newStore) })
	t.Run("ResumeGrace", func(t *testing.T) { testResumeGrace(t, newStore) })
	t.Run("Inspector", func(t *testing.T) { testInspector(t, newStore) })
	t.Run("InspectorPages", func(t *testing.T) { testInspectorPages(t, newStore) })
	t.Run("ReplayCounts", func(t *testing.T) { testReplayCounts(t, newStore) })
	t.Run("Forget", func(t *testing.T) { testForget(t, newStore) })
	t.Run("Namespaces", func(t *testing.T) { testNamespaces(t, newStore) })
	t.Run("ServiceNamespaces", func(t *testing.T) { testServiceNamespaces(t, newStore) })
	t.Run("ServiceQuotas", func(t *testing.T) { testServiceQuotas(t, newStore) })
	t.Run("FinishQuota", func(t *testing.T) { testFinishQuota(t, newStore) })
	t.Run("RecordsQuotaConcurrent", func(t *testing.T) { testRecordsQuotaConcurrent(t, newStore) })
	t.Run("UsageList", func(t *testing.T) { testUsageList(t, newStore) })
	t.Run("ResolveOnly", func(t *testing.T) { testResolveOnly(t, newStore) })
	// Not parallel: it measures a neighbour's throughput.
	t.Run("ServiceWaiters", func(t *testing.T) { testServiceWaiters(t, newStore, notifier) })
}

// newInspector returns a fresh store and its Inspector, or skips a store
// that is none.
func newInspector(t *testing.T, newStore func(*testing.T) dedupesvc.Store) (dedupesvc.Store, dedupesvc.Inspector) {
	s := newStore(t)
	inspector, ok := s.(dedupesvc.Inspector)
	if !ok {
		t.Skip("the store is not an Inspector")
	}
	return s, inspector
}

// testInspectorPages walks a listing page by page, as the admin RPC's page
// tokens do, and wants exactly the records of one unpaged listing, in the
// same order: outcome-unknown first, no record twice, none skipped.
func testInspectorPages(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()
	s, inspector := newInspector(t, newStore)
	// Keys begun together share an expiry to the store's clock resolution,
	// so the scope and key must break the tie.
	const records, unknown = 23, 5
	var wg sync.WaitGroup
	for i := range records {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lease := long
			if i < unknown {
				lease = short
			}
			p := begin(fmt.Sprintf("t-%d", i), fpA, lease, long)
			p.Scope, p.Key = fmt.Sprintf("/pkg.S/M%d", i%3), fmt.Sprintf("k%02d", i)
			mustBegin(t, s, p, dedupesvc.BeginReserved)
		}()
	}
	wg.Wait()
	time.Sleep(2 * short)
	for i := range unknown {
		p := begin("t-other", fpA, long, long)
		p.Scope, p.Key = fmt.Sprintf("/pkg.S/M%d", i%3), fmt.Sprintf("k%02d", i)
		mustBegin(t, s, p, dedupesvc.BeginOutcomeUnknown)
	}

	for _, state := range []string{"", dedupesvc.StateInFlight, dedupesvc.StateUnknown} {
		whole, err := inspector.ListRecords(ctx, dedupesvc.ListQuery{State: state, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		var paged []dedupesvc.StoredRecord
		q := dedupesvc.ListQuery{State: state, Limit: 4}
		for {
			page, err := inspector.ListRecords(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			paged = append(paged, page...)
			if len(page) < q.Limit {
				break
			}
			after := dedupesvc.PositionOf(page[len(page)-1])
			q.After = &after
		}
		ids := func(rs []dedupesvc.StoredRecord) (out []string) {
			for _, r := range rs {
				out = append(out, r.State+" "+r.ID.Scope+" "+r.ID.Key)
			}
			return out
		}
		want := map[string]int{"": records, dedupesvc.StateInFlight: records - unknown, dedupesvc.StateUnknown: unknown}[state]
		if got := ids(paged); fmt.Sprint(got) != fmt.Sprint(ids(whole)) || len(got) != want {
			t.Fatalf("state %q: pages of 4 listed %d records\n%v\nwant the %d of one listing\n%v", state, len(got), got, want, ids(whole))
		}
		if state == "" && (whole[unknown-1].State != dedupesvc.StateUnknown || whole[unknown].State == dedupesvc.StateUnknown) {
			t.Fatalf("the listing does not put the %d unknown records first: %v", unknown, ids(whole))
		}
	}
}

func testInspector(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()
	s, inspector := newInspector(t, newStore)
	// Records under two methods and two namespaces, one of them unknown.
	add := func(ns, scope, key string, lease time.Duration) dedupesvc.BeginResult {
		p := begin("t-"+key, fpA, lease, long)
		p.Namespace, p.Scope, p.Key = ns, scope, key
		return mustBegin(t, s, p, dedupesvc.BeginReserved)
	}
	r := add("svc-a", "/pkg.S/Charge|tenant-1", "k1", long)
	if err := s.Finish(ctx, dedupesvc.FinishParams{Namespace: "svc-a", Scope: "/pkg.S/Charge|tenant-1", Key: "k1", AttemptToken: "t-k1", Epoch: r.Epoch, Outcome: outA}); err != nil {
		t.Fatal(err)
	}
	add("svc-b", "/pkg.S/Charge", "k2", long)
	add("svc-a", "/pkg.S/Charge|tenant-2", "k4", long)
	add("", "/pkg.S/Send", "k3", short)
	time.Sleep(2 * short)
	p := begin("t-other", fpA, long, long)
	p.Scope, p.Key = "/pkg.S/Send", "k3"
	mustBegin(t, s, p, dedupesvc.BeginOutcomeUnknown)

	all, err := inspector.ListRecords(ctx, dedupesvc.ListQuery{Limit: 10})
	if err != nil || len(all) != 4 || all[0].State != dedupesvc.StateUnknown {
		t.Fatalf("ListRecords = %+v, %v; want 4 records, the unknown one first", all, err)
	}
	completed, err := inspector.ListRecords(ctx, dedupesvc.ListQuery{State: dedupesvc.StateCompleted, Limit: 10})
	if err != nil || len(completed) != 1 || completed[0].ID != (dedupesvc.RecordID{Namespace: "svc-a", Scope: "/pkg.S/Charge|tenant-1", Key: "k1"}) || completed[0].OutcomeSize != int64(len(outA.Value)) || completed[0].Outcome.TypeURL != outA.TypeURL {
		t.Fatalf("ListRecords(completed) = %+v, %v", completed, err)
	}
	if limited, err := inspector.ListRecords(ctx, dedupesvc.ListQuery{Limit: 2}); err != nil || len(limited) != 2 {
		t.Fatalf("ListRecords(limit 2) = %d records, %v", len(limited), err)
	}
	got, found, err := inspector.GetRecord(ctx, dedupesvc.RecordID{Namespace: "svc-b", Scope: "/pkg.S/Charge", Key: "k2"})
	if err != nil || !found || got.State != dedupesvc.StateInFlight {
		t.Fatalf("GetRecord = %+v, %v, %v", got, found, err)
	}
	if _, found, err := inspector.GetRecord(ctx, dedupesvc.RecordID{Scope: "/pkg.S/Charge", Key: "k2"}); err != nil || found {
		t.Fatalf("GetRecord outside the namespace: found=%v, %v; want none", found, err)
	}
	counts, err := inspector.CountRecords(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(counts, func(a, b dedupesvc.MethodCount) int {
		return cmp.Or(cmp.Compare(a.State, b.State), cmp.Compare(a.Method, b.Method))
	})
	// Across namespaces (svc-a, svc-b, none) and tenants (tenant-1, tenant-2, none).
	byMethod := fmt.Sprint(counts)
	if byMethod != "[{completed /pkg.S/Charge 1} {in_flight /pkg.S/Charge 2} {unknown /pkg.S/Send 1}]" {
		t.Fatalf("counts by method = %s", byMethod)
	}
	store, migrations, err := inspector.MigrationStatus(ctx)
	if err != nil || store == "" || len(migrations) == 0 || !migrations[0].Applied {
		t.Fatalf("MigrationStatus = %q, %+v, %v", store, migrations, err)
	}
}

var (
	ctx   = context.Background()
	fpA   = fingerprint("request A")
	fpB   = fingerprint("request B")
	outA  = dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.A", Value: []byte("outcome A")}
	outB  = dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.B", Value: []byte("outcome B")}
	long  = time.Hour
	short = 150 * time.Millisecond
)

func fingerprint(s string) []byte { sum := sha256.Sum256([]byte(s)); return sum[:] }

func begin(token string, fp []byte, lease, retention time.Duration) dedupesvc.BeginParams {
	return dedupesvc.BeginParams{Scope: "/pkg.S/M", Key: "key-1", Fingerprint: fp, AttemptToken: token, Lease: lease, Retention: retention, UnknownRetention: long}
}

// completed reserves key-1 for attempt t1 and finishes it with out.
func completed(t *testing.T, s dedupesvc.Store, out dedupesvc.Outcome) dedupesvc.BeginResult {
	t.Helper()
	r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
	if err := s.Finish(ctx, finish("t1", r.Epoch, out)); err != nil {
		t.Fatal(err)
	}
	return r
}

func reexecute(p dedupesvc.BeginParams) dedupesvc.BeginParams {
	p.OnLostOutcome = dedupesvc.Reexecute
	return p
}

func mustBegin(t *testing.T, s dedupesvc.Store, p dedupesvc.BeginParams, want dedupesvc.BeginState) dedupesvc.BeginResult {
	t.Helper()
	res, err := s.Begin(ctx, p)
	if err != nil {
		t.Fatalf("Begin(%s): %v", p.AttemptToken, err)
	}
	if res.State != want {
		t.Fatalf("Begin(%s) = %v, want %v", p.AttemptToken, res.State, want)
	}
	return res
}

func finish(token string, epoch int64, out dedupesvc.Outcome) dedupesvc.FinishParams {
	return dedupesvc.FinishParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: token, Epoch: epoch, Outcome: out}
}

func release(token string, epoch int64) dedupesvc.ReleaseParams {
	return dedupesvc.ReleaseParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: token, Epoch: epoch}
}

func testBegin(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()

	t.Run("reserves a new key, then answers in flight to others", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if r.Epoch < 1 || time.Until(r.LeaseExpiresAt) < 50*time.Minute {
			t.Fatalf("reserved epoch %d lease until %v, want a positive epoch and an hour's lease", r.Epoch, r.LeaseExpiresAt)
		}
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginInFlight)
	})

	t.Run("a retried Begin of the holder is reserved again, same epoch", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		first := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		again := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if again.Epoch != first.Epoch {
			t.Fatalf("retried Begin epoch %d, want %d", again.Epoch, first.Epoch)
		}
	})

	t.Run("a retried Begin of the holder after its lease ran out renews it", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		first := mustBegin(t, s, begin("t1", fpA, time.Second, long), dedupesvc.BeginReserved)
		time.Sleep(time.Second + 200*time.Millisecond)
		// The retry asks for an hour, so the check below does not race a
		// one-second lease on a starved machine.
		asked := time.Now()
		again := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if again.Epoch != first.Epoch || !again.LeaseExpiresAt.After(asked.Add(long/2)) {
			t.Fatalf("retried Begin after the lease ran out: epoch %d lease until %v; want epoch %d and a lease renewed from now",
				again.Epoch, again.LeaseExpiresAt, first.Epoch)
		}
		mustBegin(t, s, reexecute(begin("t2", fpA, long, long)), dedupesvc.BeginInFlight)
	})

	t.Run("a retried Begin of the holder revives its record marked unknown meanwhile", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		// The holder's answer was lost and its re-sent Begin comes late: a
		// duplicate found the lease run out and marked the record unknown,
		// although the holder never ran its handler (it never learnt it held
		// the key). The late Begin takes its reservation back, so the
		// interceptor can release it instead of leaving the key blocked.
		first := mustBegin(t, s, begin("t1", fpA, time.Second, long), dedupesvc.BeginReserved)
		time.Sleep(time.Second + 200*time.Millisecond)
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginOutcomeUnknown)
		again := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if again.Epoch != first.Epoch {
			t.Fatalf("revived epoch %d, want %d", again.Epoch, first.Epoch)
		}
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginInFlight)
		if err := s.Release(ctx, dedupesvc.ReleaseParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: "t1", Epoch: first.Epoch}); err != nil {
			t.Fatal(err)
		}
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginReserved)
	})

	t.Run("another fingerprint is a mismatch in every state", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		mustBegin(t, s, begin("t2", fpB, long, long), dedupesvc.BeginFingerprintMismatch)
		if err := s.Finish(ctx, finish("t1", r.Epoch, outA)); err != nil {
			t.Fatal(err)
		}
		mustBegin(t, s, begin("t2", fpB, long, long), dedupesvc.BeginFingerprintMismatch)
	})

	t.Run("a completed key answers its outcome", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		completed(t, s, outA)
		got := mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginCompleted)
		if got.Outcome.TypeURL != outA.TypeURL || !bytes.Equal(got.Outcome.Value, outA.Value) {
			t.Fatalf("outcome %+v, want %+v", got.Outcome, outA)
		}
		if got.CompletedAt.IsZero() || time.Until(got.ExpiresAt) < 50*time.Minute {
			t.Fatalf("completed at %v, expires %v", got.CompletedAt, got.ExpiresAt)
		}
	})

	t.Run("an empty outcome is stored and replayed as empty", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if err := s.Finish(ctx, finish("t1", r.Epoch, dedupesvc.Outcome{TypeURL: outA.TypeURL, Value: []byte{}})); err != nil {
			t.Fatal(err)
		}
		got := mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginCompleted)
		if len(got.Outcome.Value) != 0 || got.Outcome.TypeURL != outA.TypeURL {
			t.Fatalf("outcome %+v, want the empty %s", got.Outcome, outA.TypeURL)
		}
	})

	t.Run("under REEXECUTE an abandoned lease is taken over with a higher epoch", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		old := mustBegin(t, s, begin("t1", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		taken := mustBegin(t, s, reexecute(begin("t2", fpA, long, long)), dedupesvc.BeginReserved)
		if taken.Epoch <= old.Epoch {
			t.Fatalf("takeover epoch %d, want above %d", taken.Epoch, old.Epoch)
		}
		if err := s.Finish(ctx, finish("t1", old.Epoch, outB)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("stale holder's Finish: %v, want ErrNotHeld", err)
		}
		if err := s.Finish(ctx, finish("t2", taken.Epoch, outA)); err != nil {
			t.Fatal(err)
		}
		got := mustBegin(t, s, begin("t3", fpA, long, long), dedupesvc.BeginCompleted)
		if !bytes.Equal(got.Outcome.Value, outA.Value) {
			t.Fatalf("outcome %q, want the new holder's %q", got.Outcome.Value, outA.Value)
		}
	})

	t.Run("an expired record counts as absent, whatever its request", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		r := mustBegin(t, s, begin("t1", fpA, short, short), dedupesvc.BeginReserved)
		if err := s.Finish(ctx, finish("t1", r.Epoch, outA)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * short)
		mustBegin(t, s, begin("t2", fpB, long, long), dedupesvc.BeginReserved)
	})
}

func testBeginConcurrent(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()

	race := func(t *testing.T, s dedupesvc.Store, n int, onLost dedupesvc.LostOutcome) (reserved []string) {
		t.Helper()
		var (
			mu sync.Mutex
			wg sync.WaitGroup
		)
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				token := fmt.Sprintf("racer-%d", i)
				p := begin(token, fpA, long, long)
				p.OnLostOutcome = onLost
				res, err := s.Begin(ctx, p)
				if err != nil {
					t.Errorf("Begin: %v", err)
					return
				}
				switch res.State {
				case dedupesvc.BeginReserved:
					mu.Lock()
					reserved = append(reserved, token)
					mu.Unlock()
				case dedupesvc.BeginInFlight:
				default:
					t.Errorf("Begin = %v, want reserved or in flight", res.State)
				}
			})
		}
		close(start)
		wg.Wait()
		return reserved
	}

	t.Run("64 racers on a new key: exactly one reserves", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		if got := race(t, s, 64, dedupesvc.FailClosed); len(got) != 1 {
			t.Fatalf("%d racers reserved (%v), want exactly 1", len(got), got)
		}
	})

	t.Run("32 racers on an abandoned lease under REEXECUTE: exactly one takes over", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		mustBegin(t, s, begin("crashed", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		if got := race(t, s, 32, dedupesvc.Reexecute); len(got) != 1 {
			t.Fatalf("%d racers took over (%v), want exactly 1", len(got), got)
		}
	})
}

func testFinish(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()

	t.Run("a retried Finish succeeds and keeps the first outcome", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		r := completed(t, s, outA)
		if err := s.Finish(ctx, finish("t1", r.Epoch, outB)); err != nil {
			t.Fatalf("retried Finish: %v, want success", err)
		}
		got := mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginCompleted)
		if !bytes.Equal(got.Outcome.Value, outA.Value) {
			t.Fatalf("outcome %q, want the first %q", got.Outcome.Value, outA.Value)
		}
	})

	t.Run("a Finish from a non-holder is refused and changes nothing", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		for _, p := range []dedupesvc.FinishParams{finish("intruder", r.Epoch, outB), finish("t1", r.Epoch+1, outB)} {
			if err := s.Finish(ctx, p); !errors.Is(err, dedupesvc.ErrNotHeld) {
				t.Fatalf("Finish(%s, epoch %d): %v, want ErrNotHeld", p.AttemptToken, p.Epoch, err)
			}
		}
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginInFlight)
		if err := s.Finish(ctx, finish("t1", r.Epoch, outA)); err != nil {
			t.Fatal(err)
		}
		if err := s.Finish(ctx, finish("intruder", r.Epoch, outB)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("Finish after completion from a non-holder: %v, want ErrNotHeld", err)
		}
		got := mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginCompleted)
		if !bytes.Equal(got.Outcome.Value, outA.Value) {
			t.Fatalf("outcome %q, want %q", got.Outcome.Value, outA.Value)
		}
	})

	t.Run("a Finish for a key that does not exist is refused", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		if err := s.Finish(ctx, finish("t1", 1, outA)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("Finish: %v, want ErrNotHeld", err)
		}
	})
}

func testRelease(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()

	t.Run("release frees the key for the next attempt, and a retry succeeds", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if err := s.Release(ctx, release("t1", r.Epoch)); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, release("t1", r.Epoch)); err != nil {
			t.Fatalf("retried Release: %v", err)
		}
		next := mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginReserved)
		if next.Epoch <= r.Epoch {
			t.Fatalf("epoch after release %d, want above %d", next.Epoch, r.Epoch)
		}
		if err := s.Release(ctx, release("t1", r.Epoch)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("stale Release after another attempt reserved: %v, want ErrNotHeld", err)
		}
		mustBegin(t, s, begin("t3", fpA, long, long), dedupesvc.BeginInFlight)
	})

	t.Run("release with the outcome unknown marks the record unknown at once", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		p := release("t1", r.Epoch)
		p.OutcomeUnknown, p.UnknownRetention = true, long
		if err := s.Release(ctx, p); err != nil {
			t.Fatal(err)
		}
		if got := mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginOutcomeUnknown); got.Epoch != r.Epoch {
			t.Fatalf("outcome unknown for epoch %d, want %d", got.Epoch, r.Epoch)
		}
		mustBegin(t, s, reexecute(begin("t3", fpA, long, long)), dedupesvc.BeginOutcomeUnknown)
		if err := s.Release(ctx, p); err != nil {
			t.Fatalf("retried Release with the outcome unknown: %v", err)
		}
		other := p
		other.AttemptToken = "intruder"
		if err := s.Release(ctx, other); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("another attempt's Release with the outcome unknown: %v, want ErrNotHeld", err)
		}
		if err := s.Resolve(ctx, dedupesvc.ResolveParams{Scope: "/pkg.S/M", Key: "key-1"}); err != nil {
			t.Fatalf("Resolve(release): %v", err)
		}
		mustBegin(t, s, begin("t4", fpA, long, long), dedupesvc.BeginReserved)
	})

	t.Run("a released key still refuses another request", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		r := mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if err := s.Release(ctx, release("t1", r.Epoch)); err != nil {
			t.Fatal(err)
		}
		mustBegin(t, s, begin("t2", fpB, long, long), dedupesvc.BeginFingerprintMismatch)
	})

	t.Run("a completed record cannot be released", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		r := completed(t, s, outA)
		if err := s.Release(ctx, release("t1", r.Epoch)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("Release after Finish: %v, want ErrNotHeld", err)
		}
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginCompleted)
	})

	t.Run("releasing a key that does not exist succeeds", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		if err := s.Release(ctx, release("t1", 1)); err != nil {
			t.Fatalf("Release: %v", err)
		}
	})
}

func testSweeperDeletesExpiredInBatches(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()
	s := newStore(t)
	for i := range 25 {
		// REEXECUTE: a dead FAIL_CLOSED holder's record would stay for
		// the unknown retention.
		p := reexecute(begin(fmt.Sprint("t", i), fpA, short, short))
		p.Key = fmt.Sprint("expired-", i)
		mustBegin(t, s, p, dedupesvc.BeginReserved)
	}
	for i := range 5 {
		p := begin(fmt.Sprint("t", i), fpA, long, long)
		p.Key = fmt.Sprint("live-", i)
		mustBegin(t, s, p, dedupesvc.BeginReserved)
	}
	time.Sleep(2 * short)

	var batches []int
	counting := countingStore{Store: s, batches: &batches}
	n, err := dedupesvc.NewSweeper(counting, dedupesvc.SweeperConfig{BatchSize: 10}).SweepOnce(ctx)
	if err != nil || n != 25 {
		t.Fatalf("SweepOnce = %d, %v; want 25 deleted", n, err)
	}
	if fmt.Sprint(batches) != "[10 10 5]" {
		t.Fatalf("batches %v, want [10 10 5]", batches)
	}
	if n, _, err := s.DeleteExpired(ctx, 100); err != nil || n != 0 {
		t.Fatalf("a second sweep deleted %d (%v), want nothing left to delete", n, err)
	}
	for i := range 5 {
		p := begin("another attempt", fpA, long, long)
		p.Key = fmt.Sprint("live-", i)
		mustBegin(t, s, p, dedupesvc.BeginInFlight) // the live records survived
	}
}

// testSweeperPassesLiveRows: records past their expiry that must stay (in
// flight within their lease: a retention shorter than the lease) and that
// expired before any deletable one must not take up the sweeper's batches,
// or a sweep deletes nothing while deletable records remain.
func testSweeperPassesLiveRows(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()
	s := newStore(t)
	for i := range 3 {
		p := begin(fmt.Sprint("live-", i), fpA, long, short)
		p.Key = fmt.Sprint("live-", i)
		mustBegin(t, s, p, dedupesvc.BeginReserved)
	}
	for i := range 3 {
		p := begin(fmt.Sprint("done-", i), fpA, long, short)
		p.Key = fmt.Sprint("done-", i)
		r := mustBegin(t, s, p, dedupesvc.BeginReserved)
		f := finish(p.AttemptToken, r.Epoch, outA)
		f.Key = p.Key
		if err := s.Finish(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * short)
	var batches []int
	counting := countingStore{Store: s, batches: &batches}
	n, err := dedupesvc.NewSweeper(counting, dedupesvc.SweeperConfig{BatchSize: 2}).SweepOnce(ctx)
	if err != nil || n != 3 {
		t.Fatalf("SweepOnce = %d, %v (batches %v); want the 3 completed records deleted past the 3 live ones", n, err, batches)
	}
	for i := range 3 {
		p := begin("another attempt", fpA, long, long)
		p.Key = fmt.Sprint("live-", i)
		mustBegin(t, s, p, dedupesvc.BeginInFlight)
	}
}

type countingStore struct {
	dedupesvc.Store
	batches *[]int
}

func (c countingStore) DeleteExpired(ctx context.Context, limit int) (int, []dedupesvc.RecordID, error) {
	n, unknown, err := c.Store.DeleteExpired(ctx, limit)
	*c.batches = append(*c.batches, n)
	return n, unknown, err
}

func testLostOutcome(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()

	t.Run("FAIL_CLOSED marks an abandoned lease unknown, for every caller", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		held := mustBegin(t, s, begin("crashed", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				res, err := s.Begin(ctx, begin("racer-"+string(rune('a'+i)), fpA, long, long))
				if err != nil || res.State != dedupesvc.BeginOutcomeUnknown || res.Epoch != held.Epoch {
					t.Errorf("Begin = %+v, %v; want outcome unknown for epoch %d", res, err, held.Epoch)
				}
			})
		}
		wg.Wait()
		mustBegin(t, s, begin("other-request", fpB, long, long), dedupesvc.BeginFingerprintMismatch)
	})

	t.Run("the holder's late Finish settles an unknown record", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		held := mustBegin(t, s, begin("slow", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginOutcomeUnknown)
		if err := s.Finish(ctx, finish("slow", held.Epoch, outA)); err != nil {
			t.Fatalf("late Finish: %v", err)
		}
		got := mustBegin(t, s, begin("t3", fpA, long, long), dedupesvc.BeginCompleted)
		if !bytes.Equal(got.Outcome.Value, outA.Value) {
			t.Fatalf("outcome %q, want %q", got.Outcome.Value, outA.Value)
		}
	})

	t.Run("the holder's heartbeat revives a record marked unknown", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		held := mustBegin(t, s, begin("alive", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginOutcomeUnknown)
		if _, err := s.Heartbeat(ctx, heartbeat("intruder", held.Epoch)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("a non-holder's heartbeat on an unknown record: %v, want ErrNotHeld", err)
		}
		hb := heartbeat("alive", held.Epoch)
		hb.Lease = long
		asked := time.Now()
		until, err := s.Heartbeat(ctx, hb)
		if err != nil || !until.After(asked.Add(long/2)) {
			t.Fatalf("the holder's heartbeat on an unknown record = %v, %v; want it renewed from now", until, err)
		}
		mustBegin(t, s, reexecute(begin("t3", fpA, long, long)), dedupesvc.BeginInFlight)
		mustBegin(t, s, begin("t4", fpA, long, long), dedupesvc.BeginInFlight)
		if err := s.Resolve(ctx, dedupesvc.ResolveParams{Scope: "/pkg.S/M", Key: "key-1"}); !errors.Is(err, dedupesvc.ErrNotUnknown) {
			t.Fatalf("Resolve of the revived record: %v, want ErrNotUnknown", err)
		}
		if err := s.Finish(ctx, finish("alive", held.Epoch, outA)); err != nil {
			t.Fatalf("the revived holder's Finish: %v", err)
		}
		mustBegin(t, s, begin("t5", fpA, long, long), dedupesvc.BeginCompleted)
	})

	t.Run("a heartbeat keeps the lease", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		// A 1s lease renewed every 250ms outlives four leases' worth of
		// short ones with a wide margin for a loaded machine.
		held := mustBegin(t, s, begin("alive", fpA, time.Second, long), dedupesvc.BeginReserved)
		for range 4 {
			time.Sleep(250 * time.Millisecond)
			hb := heartbeat("alive", held.Epoch)
			hb.Lease = time.Second
			until, err := s.Heartbeat(ctx, hb)
			if err != nil || !until.After(held.LeaseExpiresAt) {
				t.Fatalf("Heartbeat = %v, %v; want a later lease end than %v", until, err, held.LeaseExpiresAt)
			}
		}
		mustBegin(t, s, reexecute(begin("taker", fpA, long, long)), dedupesvc.BeginInFlight)
		if _, err := s.Heartbeat(ctx, heartbeat("intruder", held.Epoch)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("a non-holder's heartbeat: %v, want ErrNotHeld", err)
		}
	})

	t.Run("a dead FAIL_CLOSED holder's record is outcome-unknown past its retention, though nobody asked in time", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		// Nobody Begins between the lease's end and the record's own expiry.
		held := mustBegin(t, s, begin("crashed", fpA, short, 2*short), dedupesvc.BeginReserved)
		time.Sleep(4 * short)
		if got := mustBegin(t, s, begin("retry", fpA, long, long), dedupesvc.BeginOutcomeUnknown); got.Epoch != held.Epoch {
			t.Fatalf("outcome unknown for epoch %d, want %d", got.Epoch, held.Epoch)
		}
		if n, unknown, err := s.DeleteExpired(ctx, 10); err != nil || n != 0 {
			t.Fatalf("DeleteExpired = %d, %v, %v; want the unresolved record kept for the unknown retention", n, unknown, err)
		}
		mustBegin(t, s, begin("other-request", fpB, long, long), dedupesvc.BeginFingerprintMismatch)
		if err := s.Resolve(ctx, dedupesvc.ResolveParams{Scope: "/pkg.S/M", Key: "key-1", Complete: &outA}); err != nil {
			t.Fatalf("Resolve past the record's own retention: %v", err)
		}
		mustBegin(t, s, begin("after", fpA, long, long), dedupesvc.BeginCompleted)
	})

	t.Run("a dead FAIL_CLOSED holder's record nobody asks about is swept, and warned about, only when the unknown retention ends", func(t *testing.T) {
		t.Parallel()
		// As in the case below, an attempt a starved scheduler pushed past
		// a window is logged and run again on a fresh store.
		const attempts = 5
		window := 20 * short
		for attempt := 1; ; attempt++ {
			s := newStore(t)
			p := begin("crashed", fpA, short, short)
			p.UnknownRetention = window
			start := time.Now()
			mustBegin(t, s, p, dedupesvc.BeginReserved)
			time.Sleep(3 * short) // past the lease and the retention, within the unknown retention
			n, unknown, err := s.DeleteExpired(ctx, 10)
			if took := time.Since(start); took >= window && attempt < attempts {
				t.Logf("attempt %d: %v since the reservation, past the unknown retention of %v: run again", attempt, took, window)
				continue
			}
			if err != nil || n != 0 {
				t.Fatalf("DeleteExpired = %d, %v, %v; want the dead holder's record kept for the unknown retention", n, unknown, err)
			}
			time.Sleep(window + 2*short)
			n, unknown, err = s.DeleteExpired(ctx, 10)
			if err != nil || n != 1 || len(unknown) != 1 || unknown[0].Key != "key-1" {
				t.Fatalf("DeleteExpired = %d, %v, %v; want the record deleted and reported as outcome-unknown", n, unknown, err)
			}
			return
		}
	})

	t.Run("the sweeper marks a dead FAIL_CLOSED holder's record unknown, so operators see it", func(t *testing.T) {
		t.Parallel()
		s, inspector := newInspector(t, newStore)
		held := mustBegin(t, s, begin("crashed", fpA, short, long), dedupesvc.BeginReserved)
		p := reexecute(begin("gone", fpA, short, long))
		p.Key = "reexecute-key"
		mustBegin(t, s, p, dedupesvc.BeginReserved)
		// The sweeper marks one full lease past the lease's end.
		time.Sleep(3 * short)
		if _, err := dedupesvc.NewSweeper(s, dedupesvc.SweeperConfig{}).SweepOnce(ctx); err != nil {
			t.Fatal(err)
		}
		unknown, err := inspector.ListRecords(ctx, dedupesvc.ListQuery{State: dedupesvc.StateUnknown, Limit: 10})
		if err != nil || len(unknown) != 1 || unknown[0].ID.Key != "key-1" || unknown[0].Epoch != held.Epoch {
			t.Fatalf("unknown records after a sweep = %+v, %v; want the dead FAIL_CLOSED holder's record alone", unknown, err)
		}
		if n, err := dedupesvc.NewUnknownRecords(inspector, dedupesvc.UnknownRecordsConfig{}).CountOnce(ctx); err != nil || n != 1 {
			t.Fatalf("the unknown-records count = %d, %v; want 1", n, err)
		}
		// The holder was alive after all: its heartbeat revives the record.
		if _, err := s.Heartbeat(ctx, heartbeat("crashed", held.Epoch)); err != nil {
			t.Fatalf("the holder's heartbeat on the record the sweeper marked: %v", err)
		}
	})

	t.Run("a key's epochs never repeat, even after its record was swept", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		var seen []int64
		// A REEXECUTE holder that stalls past its lease and retention: its
		// record is swept, and the key's next holder must not share its
		// fencing token.
		stalled := mustBegin(t, s, reexecute(begin("stalled", fpA, short, short)), dedupesvc.BeginReserved)
		seen = append(seen, stalled.Epoch)
		time.Sleep(2 * short)
		taken := mustBegin(t, s, reexecute(begin("taker", fpA, short, short)), dedupesvc.BeginReserved)
		seen = append(seen, taken.Epoch)
		if err := s.Finish(ctx, finish("taker", taken.Epoch, outA)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * short)
		if n, _, err := s.DeleteExpired(ctx, 10); err != nil || n != 1 {
			t.Fatalf("DeleteExpired = %d, %v; want the expired record deleted", n, err)
		}
		again := mustBegin(t, s, reexecute(begin("next", fpA, long, long)), dedupesvc.BeginReserved)
		for _, e := range seen {
			if again.Epoch <= e {
				t.Fatalf("the recreated record's epoch %d, want it above every earlier epoch of the key %v", again.Epoch, seen)
			}
		}
		if err := s.Finish(ctx, finish("stalled", again.Epoch, outB)); !errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("the stalled holder's Finish: %v, want ErrNotHeld", err)
		}
	})

	t.Run("unknown records outlive their retention until the unknown limit", func(t *testing.T) {
		t.Parallel()
		// The windows are wall time on the store's clock. What is asserted
		// holds only while the test runs inside them, so an attempt that a
		// starved scheduler pushed past a window is measured, logged and run
		// again on a fresh store instead of being judged.
		const attempts = 5
		for attempt := 1; ; attempt++ {
			s := newStore(t)
			start := time.Now()
			mustBegin(t, s, begin("crashed", fpA, short, 6*short), dedupesvc.BeginReserved)
			time.Sleep(2 * short)
			p := begin("t2", fpA, long, long)
			p.UnknownRetention = 14 * short
			res, err := s.Begin(ctx, p)
			if err != nil {
				t.Fatalf("Begin(t2): %v", err)
			}
			if took := time.Since(start); took >= 6*short && attempt < attempts {
				t.Logf("attempt %d: %v between the reservation and the duplicate, past the record's retention of %v: run again", attempt, took, 6*short)
				continue
			}
			if res.State != dedupesvc.BeginOutcomeUnknown {
				t.Fatalf("Begin(t2) = %v, want %v", res.State, dedupesvc.BeginOutcomeUnknown)
			}
			time.Sleep(5 * short) // past the record's own retention, well within the unknown limit
			n, _, err := s.DeleteExpired(ctx, 10)
			again := mustBeginState(t, s, begin("t3", fpA, long, long))
			if took := time.Since(start); took >= 14*short && attempt < attempts {
				t.Logf("attempt %d: %v since the reservation, past the unknown limit of %v: run again", attempt, took, 14*short)
				continue
			}
			if err != nil || n != 0 {
				t.Fatalf("DeleteExpired = %d, %v; an unresolved unknown record was swept early", n, err)
			}
			if again != dedupesvc.BeginOutcomeUnknown {
				t.Fatalf("Begin(t3) = %v, want %v", again, dedupesvc.BeginOutcomeUnknown)
			}
			time.Sleep(12 * short)
			n, unknown, err := s.DeleteExpired(ctx, 10)
			if err != nil || n != 1 || len(unknown) != 1 || unknown[0].Key != "key-1" {
				t.Fatalf("DeleteExpired = %d, %v, %v; want the unknown record deleted and reported", n, unknown, err)
			}
			return
		}
	})
}

// mustBeginState is Begin's state, failing the test on an error.
func mustBeginState(t *testing.T, s dedupesvc.Store, p dedupesvc.BeginParams) dedupesvc.BeginState {
	t.Helper()
	res, err := s.Begin(ctx, p)
	if err != nil {
		t.Fatalf("Begin(%s): %v", p.AttemptToken, err)
	}
	return res.State
}

func heartbeat(token string, epoch int64) dedupesvc.HeartbeatParams {
	return dedupesvc.HeartbeatParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: token, Epoch: epoch, Lease: short}
}

func testResolve(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()
	resolve := func(complete *dedupesvc.Outcome) dedupesvc.ResolveParams {
		return dedupesvc.ResolveParams{Scope: "/pkg.S/M", Key: "key-1", Complete: complete}
	}
	unknownRecord := func(t *testing.T) dedupesvc.Store {
		s := newStore(t)
		mustBegin(t, s, begin("crashed", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginOutcomeUnknown)
		return s
	}

	t.Run("complete, and a retry of it", func(t *testing.T) {
		t.Parallel()
		s := unknownRecord(t)
		if err := s.Resolve(ctx, resolve(&outA)); err != nil {
			t.Fatal(err)
		}
		if err := s.Resolve(ctx, resolve(&outA)); err != nil {
			t.Fatalf("retried Resolve: %v", err)
		}
		if err := s.Resolve(ctx, resolve(&outB)); !errors.Is(err, dedupesvc.ErrNotUnknown) {
			t.Fatalf("Resolve with another outcome: %v, want ErrNotUnknown", err)
		}
		got := mustBegin(t, s, begin("t3", fpA, long, long), dedupesvc.BeginCompleted)
		if !bytes.Equal(got.Outcome.Value, outA.Value) {
			t.Fatalf("outcome %q, want %q", got.Outcome.Value, outA.Value)
		}
	})

	t.Run("release, and a retry of it", func(t *testing.T) {
		t.Parallel()
		s := unknownRecord(t)
		if err := s.Resolve(ctx, resolve(nil)); err != nil {
			t.Fatal(err)
		}
		if err := s.Resolve(ctx, resolve(nil)); err != nil {
			t.Fatalf("retried Resolve: %v", err)
		}
		mustBegin(t, s, begin("t3", fpA, long, long), dedupesvc.BeginReserved)
	})

	t.Run("an abandoned lease nobody has asked about yet can be resolved", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		mustBegin(t, s, begin("crashed", fpA, short, long), dedupesvc.BeginReserved)
		time.Sleep(2 * short)
		if err := s.Resolve(ctx, resolve(&outA)); err != nil {
			t.Fatal(err)
		}
		mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginCompleted)
	})

	t.Run("Resolve fences the attempt whose lease ran out", func(t *testing.T) {
		t.Parallel()
		for _, complete := range []*dedupesvc.Outcome{&outA, nil} {
			s := newStore(t)
			held := mustBegin(t, s, begin("slow", fpA, short, long), dedupesvc.BeginReserved)
			time.Sleep(2 * short)
			if err := s.Resolve(ctx, resolve(complete)); err != nil {
				t.Fatal(err)
			}
			if err := s.Finish(ctx, finish("slow", held.Epoch, outB)); !errors.Is(err, dedupesvc.ErrNotHeld) {
				t.Fatalf("the old holder's Finish after Resolve(%v): %v, want ErrNotHeld", complete != nil, err)
			}
			if err := s.Release(ctx, release("slow", held.Epoch)); !errors.Is(err, dedupesvc.ErrNotHeld) {
				t.Fatalf("the old holder's Release after Resolve(%v): %v, want ErrNotHeld", complete != nil, err)
			}
			if _, err := s.Heartbeat(ctx, heartbeat("slow", held.Epoch)); !errors.Is(err, dedupesvc.ErrNotHeld) {
				t.Fatalf("the old holder's Heartbeat after Resolve(%v): %v, want ErrNotHeld", complete != nil, err)
			}
			if err := s.Resolve(ctx, resolve(complete)); err != nil {
				t.Fatalf("retried Resolve: %v", err)
			}
			if complete == nil {
				mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginReserved)
				continue
			}
			got := mustBegin(t, s, begin("t2", fpA, long, long), dedupesvc.BeginCompleted)
			if !bytes.Equal(got.Outcome.Value, outA.Value) {
				t.Fatalf("outcome %q, want the resolved %q", got.Outcome.Value, outA.Value)
			}
		}
	})

	t.Run("a live reservation, a missing key", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		if err := s.Resolve(ctx, resolve(nil)); !errors.Is(err, dedupesvc.ErrRecordNotFound) {
			t.Fatalf("Resolve of a missing key: %v, want ErrRecordNotFound", err)
		}
		mustBegin(t, s, begin("t1", fpA, long, long), dedupesvc.BeginReserved)
		if err := s.Resolve(ctx, resolve(&outA)); !errors.Is(err, dedupesvc.ErrNotUnknown) {
			t.Fatalf("Resolve of a live reservation: %v, want ErrNotUnknown", err)
		}
	})
}

// graceLease is the lease of the resume-grace cases: long enough that the
// checks right after MarkResumed usually run within it on a loaded machine.
// A case that did not is repeated, never failed for being slow.
const graceLease = time.Second

// afterResume reserves key-1 for "holder" with graceLease, lets the lease run
// out, marks the store resumed and runs check at once. It returns the store
// and the holder's reservation once check ran within the grace (check's
// findings are then binding), and skips the test when it never did.
func afterResume(t *testing.T, newStore func(*testing.T) dedupesvc.Store, retention time.Duration, check func(s dedupesvc.Store) []string) (dedupesvc.Store, dedupesvc.BeginResult) {
	t.Helper()
	for range 3 {
		s := newStore(t)
		resumer, ok := s.(dedupesvc.Resumer)
		if !ok {
			t.Skip("the store is not a Resumer")
		}
		held := mustBegin(t, s, begin("holder", fpA, graceLease, retention), dedupesvc.BeginReserved)
		time.Sleep(graceLease + 200*time.Millisecond)
		resumed := time.Now()
		if err := resumer.MarkResumed(ctx); err != nil {
			t.Fatal(err)
		}
		problems := check(s)
		if time.Since(resumed) >= graceLease {
			t.Logf("the checks took %v, longer than the grace; trying again", time.Since(resumed))
			continue
		}
		for _, p := range problems {
			t.Error(p)
		}
		if t.Failed() {
			t.FailNow()
		}
		return s, held
	}
	t.Skip("the machine never ran the checks within the grace")
	return nil, dedupesvc.BeginResult{}
}

func testResumeGrace(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()

	t.Run("no takeover, unknown or Resolve within a lease after the resume; as before after it", func(t *testing.T) {
		t.Parallel()
		s, _ := afterResume(t, newStore, long, func(s dedupesvc.Store) (problems []string) {
			for _, p := range []dedupesvc.BeginParams{reexecute(begin("taker", fpA, long, long)), begin("fail-closed", fpA, long, long)} {
				if res, err := s.Begin(ctx, p); err != nil || res.State != dedupesvc.BeginInFlight {
					problems = append(problems, fmt.Sprintf("Begin(%s, %v) after the resume = %v, %v; want in flight", p.AttemptToken, p.OnLostOutcome, res.State, err))
				}
			}
			if err := s.Resolve(ctx, dedupesvc.ResolveParams{Scope: "/pkg.S/M", Key: "key-1"}); !errors.Is(err, dedupesvc.ErrNotUnknown) {
				problems = append(problems, fmt.Sprintf("Resolve after the resume: %v, want ErrNotUnknown", err))
			}
			return problems
		})
		time.Sleep(graceLease + 200*time.Millisecond)
		mustBegin(t, s, begin("fail-closed", fpA, long, long), dedupesvc.BeginOutcomeUnknown)
	})

	t.Run("REEXECUTE takes over after a full lease past the resume", func(t *testing.T) {
		t.Parallel()
		s, held := afterResume(t, newStore, long, func(s dedupesvc.Store) []string {
			if res, err := s.Begin(ctx, reexecute(begin("taker", fpA, long, long))); err != nil || res.State != dedupesvc.BeginInFlight {
				return []string{fmt.Sprintf("REEXECUTE Begin after the resume = %v, %v; want in flight", res.State, err)}
			}
			return nil
		})
		time.Sleep(graceLease + 200*time.Millisecond)
		taken := mustBegin(t, s, reexecute(begin("taker", fpA, long, long)), dedupesvc.BeginReserved)
		if taken.Epoch <= held.Epoch {
			t.Fatalf("takeover epoch %d, want above %d", taken.Epoch, held.Epoch)
		}
	})

	t.Run("an in-flight record whose retention ran out with its lease is not taken during the grace", func(t *testing.T) {
		t.Parallel()
		s, _ := afterResume(t, newStore, graceLease, func(s dedupesvc.Store) []string {
			if res, err := s.Begin(ctx, begin("other", fpA, long, long)); err != nil || res.State != dedupesvc.BeginInFlight {
				return []string{fmt.Sprintf("Begin after the resume = %v, %v; want in flight", res.State, err)}
			}
			if n, _, err := s.DeleteExpired(ctx, 10); err != nil || n != 0 {
				return []string{fmt.Sprintf("DeleteExpired after the resume = %d, %v; want the record kept", n, err)}
			}
			return nil
		})
		time.Sleep(graceLease + 200*time.Millisecond)
		// Past the grace the FAIL_CLOSED holder's lease ran out with no
		// outcome: its record, past its own retention, is outcome-unknown
		// for the unknown retention, not absent.
		mustBegin(t, s, begin("other", fpA, long, long), dedupesvc.BeginOutcomeUnknown)
	})

	t.Run("the holder renews and finishes after the resume", func(t *testing.T) {
		t.Parallel()
		s, held := afterResume(t, newStore, long, func(dedupesvc.Store) []string { return nil })
		hb := heartbeat("holder", held.Epoch)
		hb.Lease = long
		if _, err := s.Heartbeat(ctx, hb); err != nil {
			t.Fatalf("the holder's heartbeat after the resume: %v", err)
		}
		if err := s.Finish(ctx, finish("holder", held.Epoch, outA)); err != nil {
			t.Fatalf("the holder's Finish after the resume: %v", err)
		}
		got := mustBegin(t, s, reexecute(begin("t2", fpA, long, long)), dedupesvc.BeginCompleted)
		if !bytes.Equal(got.Outcome.Value, outA.Value) {
			t.Fatalf("outcome %q, want %q", got.Outcome.Value, outA.Value)
		}
	})
}

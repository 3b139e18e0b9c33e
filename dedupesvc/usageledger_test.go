package dedupesvc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeUsage is a UsageReader whose answer the test sets.
type fakeUsage struct {
	mu             sync.Mutex
	records, bytes int64
	err            error
	reads          int
}

func (f *fakeUsage) NamespaceUsage(context.Context, string) (int64, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return f.records, f.bytes, f.err
}

func (f *fakeUsage) set(records, bytes int64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records, f.bytes, f.err = records, bytes, err
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newTestLedger() (*usageLedger, *fakeUsage, *fakeClock) {
	reader, clock := &fakeUsage{}, &fakeClock{t: time.Unix(1e9, 0)}
	l := newUsageLedger(reader)
	l.now = clock.now
	return l, reader, clock
}

// ledgerHolding is a test ledger whose store holds records and bytes for
// "tenant", read once: a first Begin with params first is admitted and
// lands (reserving when reserved), and its read has settled.
func ledgerHolding(t *testing.T, records, bytes int64, first BeginParams, reserved bool) *usageLedger {
	t.Helper()
	l, reader, _ := newTestLedger()
	reader.set(records, bytes, nil)
	_, done := admitted(t, l, first)
	done(reserved)
	settled(t, l, "tenant")
	return l
}

// settled waits until no read of ns is in flight.
func settled(t *testing.T, l *usageLedger, ns string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		l.mu.Lock()
		e := l.m[ns]
		l.mu.Unlock()
		if e != nil {
			e.mu.Lock()
			reading := e.reading
			e.mu.Unlock()
			if !reading {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the usage read did not end")
		}
		time.Sleep(time.Millisecond)
	}
}

func quotaParams(records, bytes int64) BeginParams {
	return BeginParams{Namespace: "tenant", MaxRecords: records, MaxOutcomeBytes: bytes}
}

// admitted is l.admit that must not fail.
func admitted(t *testing.T, l *usageLedger, p BeginParams) (BeginParams, func(bool)) {
	t.Helper()
	p, done, err := l.admit(context.Background(), p)
	if err != nil {
		t.Fatalf("admit: %v", err)
	}
	return p, done
}

// fast reports whether admit let p skip the store's check.
func fast(p BeginParams) bool { return p.MaxRecords == 0 && p.MaxOutcomeBytes == 0 }

// expectFastPath admits one Begin of records quota q for each q in fastByQuota,
// in descending order, each landing with nothing stored, and checks that it
// skipped the store's check exactly when fastByQuota[q] says; state says
// what the ledger held, for the failure message.
func expectFastPath(t *testing.T, l *usageLedger, state string, fastByQuota map[int64]bool) {
	t.Helper()
	for _, quota := range slices.Backward(slices.Sorted(maps.Keys(fastByQuota))) {
		p, done := admitted(t, l, quotaParams(quota, 0))
		done(false)
		if fast(p) != fastByQuota[quota] {
			t.Errorf("%s, quota %d: fast path %v, want %v", state, quota, fast(p), fastByQuota[quota])
		}
	}
}

func TestUsageLedgerSkipsTheStoresCheckFarBelowTheQuotas(t *testing.T) {
	l, reader, clock := newTestLedger()
	reader.set(10, 100, nil)
	// No read yet: the store checks, and the first Begin starts a read.
	p, done := admitted(t, l, quotaParams(1000, 1<<20))
	if fast(p) {
		t.Fatal("a Begin before any read skipped the store's check")
	}
	done(true)
	settled(t, l, "tenant")
	p, done = admitted(t, l, quotaParams(1000, 1<<20))
	if !fast(p) {
		t.Fatalf("a Begin 989 records below its quota kept the store's check: %+v", p)
	}
	done(true)
	// Only one read an interval, however many Begins.
	for range 100 {
		_, done := admitted(t, l, quotaParams(1000, 1<<20))
		done(true)
	}
	settled(t, l, "tenant")
	if reader.reads != 1 {
		t.Fatalf("%d reads within one interval, want 1", reader.reads)
	}
	clock.add(usageReadEvery)
	_, done = admitted(t, l, quotaParams(1000, 1<<20))
	done(false)
	settled(t, l, "tenant")
	if reader.reads != 2 {
		t.Fatalf("%d reads after an interval, want 2", reader.reads)
	}
	// A Begin without quotas is passed through untouched.
	p, done = admitted(t, l, BeginParams{Namespace: "tenant"})
	done(true)
	if p.MaxRecords != 0 || p.MaxOutcomeBytes != 0 {
		t.Fatalf("a Begin without quotas got %+v", p)
	}
}

func TestUsageLedgerCountsItsOwnBeginsUpToTheQuota(t *testing.T) {
	l := ledgerHolding(t, 5, 0, quotaParams(10, 0), false)
	// 5 held, quota 10: five Begins in flight at once fit.
	var dones []func(bool)
	for i := range 5 {
		p, done := admitted(t, l, quotaParams(10, 0))
		dones = append(dones, done)
		if !fast(p) {
			t.Fatalf("Begin %d with %d in flight kept the store's check", i, i)
		}
	}
	// Three reserved, two did not (duplicates, say): the three still count
	// until a read sees them.
	for i, done := range dones {
		done(i < 3)
	}
	expectFastPath(t, l, "5 held and 3 reserved since", map[int64]bool{10: true, 9: true, 8: false})
}

func TestUsageLedgerLetsItsFastBeginsLandBeforeTheStoresCheck(t *testing.T) {
	l := ledgerHolding(t, 0, 0, quotaParams(10, 0), false)
	// Ten Begins skip the store's check and have not landed; the store's
	// check sees only committed records, so the eleventh waits for them.
	var dones []func(bool)
	for range 10 {
		p, done := admitted(t, l, quotaParams(10, 0))
		if !fast(p) {
			t.Fatal("a Begin with room kept the store's check")
		}
		dones = append(dones, done)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := l.admit(cancelled, quotaParams(10, 0)); !errors.Is(err, context.Canceled) {
		t.Fatalf("a Begin given up while Begins skipping the check were in flight: %v, want context.Canceled", err)
	}
	got := make(chan BeginParams, 1)
	go func() {
		p, done := admitted(t, l, quotaParams(10, 0))
		done(false)
		got <- p
	}()
	l.mu.Lock()
	e := l.m["tenant"]
	l.mu.Unlock()
	for {
		e.mu.Lock()
		checking := e.checking
		e.mu.Unlock()
		if checking == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// While it waits, a Begin with room (one did not reserve) does not
	// skip the check either: the waiter is not starved.
	dones[0](false)
	cancelled2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, _, err := l.admit(cancelled2, quotaParams(10, 0)); !errors.Is(err, context.Canceled) {
		t.Fatalf("a Begin with room while another waits for the check: %v, want to wait too", err)
	}
	select {
	case p := <-got:
		t.Fatalf("the store's check was taken with Begins skipping it in flight: %+v", p)
	default:
	}
	for _, done := range dones[1:] {
		done(true)
	}
	if p := <-got; fast(p) || p.MaxRecords != 10 {
		t.Fatalf("once they landed, the waiting Begin got %+v; want the store's check against the quota, 10", p)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.inFlight != 0 || e.fastInFlight != 0 || e.checking != 0 {
		t.Fatalf("in flight %d, skipping %d, waiting %d after every Begin returned; want 0", e.inFlight, e.fastInFlight, e.checking)
	}
}

func TestUsageLedgerKeepsOtherReplicasGrowthAsAMargin(t *testing.T) {
	l, reader, clock := newTestLedger()
	reader.set(100, 0, nil)
	_, done := admitted(t, l, quotaParams(1000, 0))
	done(false)
	settled(t, l, "tenant")
	// Other replicas add 400 within the next interval, this one 0.
	reader.set(500, 0, nil)
	clock.add(usageReadEvery)
	_, done = admitted(t, l, quotaParams(1000, 0))
	done(false)
	settled(t, l, "tenant")
	// 500 held, 400 a interval elsewhere: up to 599 the store is skipped,
	// within 400 of the quota it checks.
	expectFastPath(t, l, "500 held, 400 grown elsewhere", map[int64]bool{902: true, 901: true, 900: false, 600: false})
}

func TestUsageLedgerCountsStoredBytes(t *testing.T) {
	l := ledgerHolding(t, 0, 900, quotaParams(0, 1000), true)
	if p, done := admitted(t, l, quotaParams(0, 1000)); !fast(p) {
		t.Fatal("900 of 1000 bytes held: the store's check was kept")
	} else {
		done(true)
	}
	l.storedBytes("tenant", 100)
	if p, done := admitted(t, l, quotaParams(0, 1000)); fast(p) {
		t.Fatal("1000 of 1000 bytes held after this replica stored 100: the store's check was skipped")
	} else {
		done(false)
	}
}

func TestUsageLedgerFallsBackToTheStoreWhenItsReadGoesStale(t *testing.T) {
	l, reader, clock := newTestLedger()
	reader.set(1, 0, nil)
	_, done := admitted(t, l, quotaParams(1000, 0))
	done(false)
	settled(t, l, "tenant")
	reader.set(0, 0, errors.New("store away"))
	for range 10 {
		clock.add(usageReadEvery)
		p, done := admitted(t, l, quotaParams(1000, 0))
		done(false)
		settled(t, l, "tenant")
		stale := clock.now().Sub(time.Unix(1e9, 0)) >= usageReadStale
		if fast(p) == stale {
			t.Fatalf("%s after the last good read: fast path %v", clock.now().Sub(time.Unix(1e9, 0)), fast(p))
		}
	}
	reader.set(1, 0, nil)
	_, done = admitted(t, l, quotaParams(1000, 0))
	done(false)
	settled(t, l, "tenant")
	if p, done := admitted(t, l, quotaParams(1000, 0)); !fast(p) {
		t.Fatal("after the store's return and a good read, the store's check was kept")
	} else {
		done(false)
	}
}

func TestUsageLedgerBoundsItsNamespaces(t *testing.T) {
	l, _, clock := newTestLedger()
	for i := range maxLedgerNamespaces {
		_, done := admitted(t, l, BeginParams{Namespace: fmt.Sprint("ns", i), MaxRecords: 10})
		done(false)
	}
	for i := range maxLedgerNamespaces {
		settled(t, l, fmt.Sprint("ns", i))
	}
	// Full of namespaces used just now: a new one takes the store's check
	// and is not kept.
	if p, done := admitted(t, l, BeginParams{Namespace: "late", MaxRecords: 10}); fast(p) {
		t.Fatal("a namespace past the bound skipped the store's check")
	} else {
		done(true)
	}
	if len(l.m) != maxLedgerNamespaces {
		t.Fatalf("%d namespaces kept, want %d", len(l.m), maxLedgerNamespaces)
	}
	// Once they are idle, they make room.
	clock.add(usageReadStale + time.Second)
	_, done := admitted(t, l, BeginParams{Namespace: "late", MaxRecords: 10})
	done(true)
	settled(t, l, "late")
	if len(l.m) != 1 {
		t.Fatalf("%d namespaces kept after the idle ones were dropped, want 1", len(l.m))
	}
}

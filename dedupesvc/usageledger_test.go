package dedupesvc

import (
	"context"
	"errors"
	"fmt"
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

// fast reports whether admit let p skip the store's check.
func fast(p BeginParams) bool { return p.MaxRecords == 0 && p.MaxOutcomeBytes == 0 }

func TestUsageLedgerSkipsTheStoresCheckFarBelowTheQuotas(t *testing.T) {
	l, reader, clock := newTestLedger()
	reader.set(10, 100, nil)
	// No read yet: the store checks, and the first Begin starts a read.
	p, done := l.admit(quotaParams(1000, 1<<20))
	if fast(p) {
		t.Fatal("a Begin before any read skipped the store's check")
	}
	done(true)
	settled(t, l, "tenant")
	p, done = l.admit(quotaParams(1000, 1<<20))
	if !fast(p) {
		t.Fatalf("a Begin 989 records below its quota kept the store's check: %+v", p)
	}
	done(true)
	// Only one read an interval, however many Begins.
	for range 100 {
		_, done := l.admit(quotaParams(1000, 1<<20))
		done(true)
	}
	settled(t, l, "tenant")
	if reader.reads != 1 {
		t.Fatalf("%d reads within one interval, want 1", reader.reads)
	}
	clock.add(usageReadEvery)
	_, done = l.admit(quotaParams(1000, 1<<20))
	done(false)
	settled(t, l, "tenant")
	if reader.reads != 2 {
		t.Fatalf("%d reads after an interval, want 2", reader.reads)
	}
	// A Begin without quotas is passed through untouched.
	p, done = l.admit(BeginParams{Namespace: "tenant"})
	done(true)
	if p.MaxRecords != 0 || p.MaxOutcomeBytes != 0 {
		t.Fatalf("a Begin without quotas got %+v", p)
	}
}

func TestUsageLedgerCountsItsOwnBeginsUpToTheQuota(t *testing.T) {
	l, reader, _ := newTestLedger()
	reader.set(5, 0, nil)
	_, done := l.admit(quotaParams(10, 0))
	done(false)
	settled(t, l, "tenant")
	// 5 held, quota 10: five Begins in flight at once fit, the sixth takes
	// the store's check.
	var dones []func(bool)
	for i := range 6 {
		p, done := l.admit(quotaParams(10, 0))
		dones = append(dones, done)
		if want := i < 5; fast(p) != want {
			t.Fatalf("Begin %d with %d in flight: fast path %v, want %v", i, i, fast(p), want)
		}
	}
	// Three reserved, three did not (duplicates, say): the three still
	// count until a read sees them.
	for i, done := range dones {
		done(i%2 == 0)
	}
	for i := range 3 {
		p, done := l.admit(quotaParams(10, 0))
		defer done(false)
		if want := i < 2; fast(p) != want {
			t.Fatalf("after 3 reservations, Begin %d: fast path %v, want %v", i, fast(p), want)
		}
	}
}

func TestUsageLedgerKeepsOtherReplicasGrowthAsAMargin(t *testing.T) {
	l, reader, clock := newTestLedger()
	reader.set(100, 0, nil)
	_, done := l.admit(quotaParams(1000, 0))
	done(false)
	settled(t, l, "tenant")
	// Other replicas add 400 within the next interval, this one 0.
	reader.set(500, 0, nil)
	clock.add(usageReadEvery)
	_, done = l.admit(quotaParams(1000, 0))
	done(false)
	settled(t, l, "tenant")
	// 500 held, 400 a interval elsewhere: up to 599 the store is skipped,
	// within 400 of the quota it checks.
	for _, c := range []struct {
		quota int64
		fast  bool
	}{{902, true}, {901, true}, {900, false}, {600, false}} {
		p, done := l.admit(quotaParams(c.quota, 0))
		done(false)
		if fast(p) != c.fast {
			t.Errorf("500 held, 400 grown elsewhere, quota %d: fast path %v, want %v", c.quota, fast(p), c.fast)
		}
	}
}

func TestUsageLedgerCountsStoredBytes(t *testing.T) {
	l, reader, _ := newTestLedger()
	reader.set(0, 900, nil)
	_, done := l.admit(quotaParams(0, 1000))
	done(true)
	settled(t, l, "tenant")
	if p, done := l.admit(quotaParams(0, 1000)); !fast(p) {
		t.Fatal("900 of 1000 bytes held: the store's check was kept")
	} else {
		done(true)
	}
	l.storedBytes("tenant", 100)
	if p, done := l.admit(quotaParams(0, 1000)); fast(p) {
		t.Fatal("1000 of 1000 bytes held after this replica stored 100: the store's check was skipped")
	} else {
		done(false)
	}
}

func TestUsageLedgerFallsBackToTheStoreWhenItsReadGoesStale(t *testing.T) {
	l, reader, clock := newTestLedger()
	reader.set(1, 0, nil)
	_, done := l.admit(quotaParams(1000, 0))
	done(false)
	settled(t, l, "tenant")
	reader.set(0, 0, errors.New("store away"))
	for range 10 {
		clock.add(usageReadEvery)
		p, done := l.admit(quotaParams(1000, 0))
		done(false)
		settled(t, l, "tenant")
		stale := clock.now().Sub(time.Unix(1e9, 0)) >= usageReadStale
		if fast(p) == stale {
			t.Fatalf("%s after the last good read: fast path %v", clock.now().Sub(time.Unix(1e9, 0)), fast(p))
		}
	}
	reader.set(1, 0, nil)
	_, done = l.admit(quotaParams(1000, 0))
	done(false)
	settled(t, l, "tenant")
	if p, done := l.admit(quotaParams(1000, 0)); !fast(p) {
		t.Fatal("after the store's return and a good read, the store's check was kept")
	} else {
		done(false)
	}
}

func TestUsageLedgerBoundsItsNamespaces(t *testing.T) {
	l, _, clock := newTestLedger()
	for i := range maxLedgerNamespaces {
		_, done := l.admit(BeginParams{Namespace: fmt.Sprint("ns", i), MaxRecords: 10})
		done(false)
	}
	for i := range maxLedgerNamespaces {
		settled(t, l, fmt.Sprint("ns", i))
	}
	// Full of namespaces used just now: a new one takes the store's check
	// and is not kept.
	if p, done := l.admit(BeginParams{Namespace: "late", MaxRecords: 10}); fast(p) {
		t.Fatal("a namespace past the bound skipped the store's check")
	} else {
		done(true)
	}
	if len(l.m) != maxLedgerNamespaces {
		t.Fatalf("%d namespaces kept, want %d", len(l.m), maxLedgerNamespaces)
	}
	// Once they are idle, they make room.
	clock.add(usageReadStale + time.Second)
	_, done := l.admit(BeginParams{Namespace: "late", MaxRecords: 10})
	done(true)
	settled(t, l, "late")
	if len(l.m) != 1 {
		t.Fatalf("%d namespaces kept after the idle ones were dropped, want 1", len(l.m))
	}
}

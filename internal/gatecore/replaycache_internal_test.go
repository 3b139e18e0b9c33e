package gatecore

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
)

// fakeClock is a replay cache's clock that moves only when told.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newTestCache(entries, bytes int, ttl time.Duration) (*ReplayCache, *fakeClock) {
	clock := &fakeClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	c := NewReplayCache(entries, bytes, ttl)
	c.now = clock.now
	return c, clock
}

var (
	fp1 = []byte("fingerprint-1")
	fp2 = []byte("fingerprint-2")
)

func outcomeOf(n int) *anypb.Any {
	return &anypb.Any{TypeUrl: "type.googleapis.com/x.R", Value: make([]byte, n)}
}

func TestReplayCacheEvictsLeastRecentlyUsedByEntries(t *testing.T) {
	c, clock := newTestCache(2, 1<<20, time.Minute)
	far := clock.t.Add(time.Hour)
	c.Put("s", "a", fp1, Stored{Outcome: outcomeOf(1), ExpiresAt: far})
	c.Put("s", "b", fp1, Stored{Outcome: outcomeOf(1), ExpiresAt: far})
	if _, ok := c.Get("s", "a", fp1); !ok { // a is now the most recently used
		t.Fatal("a missing")
	}
	c.Put("s", "c", fp1, Stored{Outcome: outcomeOf(1), ExpiresAt: far})
	if _, ok := c.Get("s", "b", fp1); ok {
		t.Error("b, the least recently used, was not evicted")
	}
	for _, k := range []string{"a", "c"} {
		if _, ok := c.Get("s", k, fp1); !ok {
			t.Errorf("%s was evicted", k)
		}
	}
	if n, _ := c.Len(); n != 2 {
		t.Errorf("%d entries, want 2", n)
	}
}

func TestReplayCacheEvictsByBytes(t *testing.T) {
	const value = 1000
	c, clock := newTestCache(100, 2*(replayEntryOverhead+value+100), time.Minute)
	far := clock.t.Add(time.Hour)
	for _, k := range []string{"a", "b", "c"} {
		c.Put("s", k, fp1, Stored{Outcome: outcomeOf(value), ExpiresAt: far})
	}
	if n, size := c.Len(); n != 2 || size > c.maxBytes {
		t.Fatalf("%d entries of %d bytes, want 2 within %d", n, size, c.maxBytes)
	}
	if _, ok := c.Get("s", "a", fp1); ok {
		t.Error("the oldest entry was not evicted")
	}
	c.Put("s", "huge", fp1, Stored{Outcome: outcomeOf(c.maxBytes), ExpiresAt: far})
	if _, ok := c.Get("s", "huge", fp1); ok {
		t.Error("an outcome over maxBytes was cached")
	}
	if n, _ := c.Len(); n != 2 {
		t.Errorf("an outcome too large to cache evicted others: %d entries left", n)
	}
}

func TestReplayCacheHonoursExpiry(t *testing.T) {
	c, clock := newTestCache(10, 1<<20, time.Minute)
	// The record expires in 30s: served until 30s less the margin.
	c.Put("s", "record", fp1, Stored{Outcome: outcomeOf(1), ExpiresAt: clock.t.Add(30 * time.Second)})
	// The record outlives the TTL: served for the TTL.
	c.Put("s", "ttl", fp1, Stored{Outcome: outcomeOf(1), ExpiresAt: clock.t.Add(time.Hour)})
	// The record expires within the margin: never cached.
	c.Put("s", "soon", fp1, Stored{Outcome: outcomeOf(1), ExpiresAt: clock.t.Add(ReplayCacheClockMargin)})

	if _, ok := c.Get("s", "soon", fp1); ok {
		t.Error("an outcome whose record expires within the clock margin was cached")
	}
	clock.t = clock.t.Add(30*time.Second - ReplayCacheClockMargin - time.Nanosecond)
	if _, ok := c.Get("s", "record", fp1); !ok {
		t.Error("missing before its record's expiry less the margin")
	}
	clock.t = clock.t.Add(time.Nanosecond)
	if _, ok := c.Get("s", "record", fp1); ok {
		t.Error("served at its record's expiry less the margin")
	}
	clock.t = clock.t.Add(time.Minute)
	if _, ok := c.Get("s", "ttl", fp1); ok {
		t.Error("served past the TTL")
	}
	if n, _ := c.Len(); n != 0 {
		t.Errorf("%d expired entries kept", n)
	}
}

func TestReplayCacheMatchesTheFingerprint(t *testing.T) {
	c, clock := newTestCache(10, 1<<20, time.Minute)
	c.Put("s", "k", fp1, Stored{Outcome: outcomeOf(1), ExpiresAt: clock.t.Add(time.Hour)})
	if _, ok := c.Get("s", "k", fp2); ok {
		t.Error("served to a request with another fingerprint")
	}
	if _, ok := c.Get("other", "k", fp1); ok {
		t.Error("served in another scope")
	}
	if _, ok := c.Get("s", "k", fp1); !ok {
		t.Error("a mismatch evicted the entry")
	}
}

func TestReplayCacheOffUnlessBounded(t *testing.T) {
	for _, bounds := range [][2]int{{0, 1 << 20}, {10, 0}} {
		if c := NewReplayCache(bounds[0], bounds[1], time.Minute); c != nil {
			t.Errorf("NewReplayCache(%d, %d) is on", bounds[0], bounds[1])
		}
	}
}

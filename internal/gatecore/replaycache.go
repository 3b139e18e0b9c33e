package gatecore

import (
	"bytes"
	"container/list"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
)

// ReplayCacheClockMargin is taken off a record's expiry before a cached
// outcome is served: the expiry is the Dedupe service's clock (or, after a
// Finish, this process's estimate of it), and this process's clock may run
// behind it. A cached outcome is never served within this margin of its
// record's expiry.
const ReplayCacheClockMargin = 5 * time.Second

// DefaultReplayCacheTTL is how long a cached outcome is served at most, by
// default (the interceptor's WithReplayCacheTTL, mcpgate's WithReplayCache).
const DefaultReplayCacheTTL = time.Minute

// DefaultMaxOutcomeBytes is the largest serialized outcome a gate stores for
// replay by default: 1 MiB, the Dedupe service's default limit.
const DefaultMaxOutcomeBytes = 1 << 20

// replayEntryOverhead approximates an entry's memory beyond its bytes (the
// map slot, the list element, the Any and the entry itself), so many tiny
// outcomes still count against maxBytes.
const replayEntryOverhead = 160

// ReplayCache holds completed outcomes by (scope, key), least recently used
// first out, within a number of entries and of bytes, so a duplicate with
// the same fingerprint is answered without a Dedupe call. It is safe for
// concurrent use.
type ReplayCache struct {
	maxEntries, maxBytes int
	ttl                  time.Duration
	now                  func() time.Time

	mu      sync.Mutex
	bytes   int
	entries map[replayKey]*list.Element
	order   *list.List // of *replayEntry, most recently used first
}

type replayKey struct{ scope, key string }

// Stored is a completed record as a replay needs it.
type Stored struct {
	// Outcome is the stored outcome.
	Outcome *anypb.Any
	// CompletedAt and ExpiresAt are the record's completed_at and
	// expires_at: the Dedupe service's, from a Begin that answered
	// completed, or this process's estimate, from its own Finish.
	CompletedAt, ExpiresAt time.Time
}

type replayEntry struct {
	id replayKey
	Stored
	fingerprint []byte
	// until is when the entry stops being served: the earlier of the TTL
	// and the record's expiry less ReplayCacheClockMargin.
	until time.Time
	size  int
}

// NewReplayCache returns a cache of at most maxEntries outcomes and about
// maxBytes, each served for at most ttl; nil (no cache) when any is not
// positive. A nil cache is never asked: callers check for it.
func NewReplayCache(maxEntries, maxBytes int, ttl time.Duration) *ReplayCache {
	if maxEntries <= 0 || maxBytes <= 0 || ttl <= 0 {
		return nil
	}
	return &ReplayCache{maxEntries: maxEntries, maxBytes: maxBytes, ttl: ttl, now: time.Now,
		entries: map[replayKey]*list.Element{}, order: list.New()}
}

// Get returns the outcome cached for (scope, key) when its fingerprint is
// fingerprint and it has not expired. A different fingerprint is a miss:
// the Dedupe service answers it (fingerprint_mismatch).
func (c *ReplayCache) Get(scope, key string, fingerprint []byte) (Stored, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[replayKey{scope, key}]
	if !ok {
		return Stored{}, false
	}
	e := el.Value.(*replayEntry)
	if !c.now().Before(e.until) {
		c.remove(el)
		return Stored{}, false
	}
	if !bytes.Equal(e.fingerprint, fingerprint) {
		return Stored{}, false
	}
	c.order.MoveToFront(el)
	return e.Stored, true
}

// Put caches a completed outcome. Its outcome is shared with every
// duplicate served from it, so neither the caller nor the cache may change
// it afterwards.
func (c *ReplayCache) Put(scope, key string, fingerprint []byte, stored Stored) {
	now := c.now()
	until := now.Add(c.ttl)
	if last := stored.ExpiresAt.Add(-ReplayCacheClockMargin); last.Before(until) {
		until = last
	}
	if !now.Before(until) {
		return
	}
	outcome := stored.Outcome
	size := replayEntryOverhead + len(scope) + len(key) + len(fingerprint) + len(outcome.GetTypeUrl()) + len(outcome.GetValue())
	if size > c.maxBytes {
		return
	}
	id := replayKey{scope, key}
	e := &replayEntry{id: id, Stored: stored, fingerprint: fingerprint, until: until, size: size}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[id]; ok {
		c.remove(el)
	}
	c.entries[id] = c.order.PushFront(e)
	c.bytes += size
	for len(c.entries) > c.maxEntries || c.bytes > c.maxBytes {
		c.remove(c.order.Back())
	}
}

func (c *ReplayCache) remove(el *list.Element) {
	e := c.order.Remove(el).(*replayEntry)
	delete(c.entries, e.id)
	c.bytes -= e.size
}

// Len returns the number of entries and their bytes.
func (c *ReplayCache) Len() (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.bytes
}

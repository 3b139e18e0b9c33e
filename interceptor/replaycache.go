package interceptor

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
// default (WithReplayCacheTTL).
const DefaultReplayCacheTTL = time.Minute

// replayEntryOverhead approximates an entry's memory beyond its bytes (the
// map slot, the list element, the Any and the entry itself), so many tiny
// outcomes still count against maxBytes.
const replayEntryOverhead = 160

// replayCache holds completed outcomes by (scope, key), least recently used
// first out, within a number of entries and of bytes.
type replayCache struct {
	maxEntries, maxBytes int
	ttl                  time.Duration
	now                  func() time.Time

	mu      sync.Mutex
	bytes   int
	entries map[replayKey]*list.Element
	order   *list.List // of *replayEntry, most recently used first
}

type replayKey struct{ scope, key string }

// cachedOutcome is a completed record as a replay needs it.
type cachedOutcome struct {
	outcome *anypb.Any
	// completedAt and expiresAt are the record's completed_at and
	// expires_at: the Dedupe service's, from a Begin that answered
	// completed, or this process's estimate, from its own Finish.
	completedAt, expiresAt time.Time
}

type replayEntry struct {
	id replayKey
	cachedOutcome
	fingerprint []byte
	// until is when the entry stops being served: the earlier of the TTL
	// and the record's expiry less ReplayCacheClockMargin.
	until time.Time
	size  int
}

func newReplayCache(maxEntries, maxBytes int, ttl time.Duration) *replayCache {
	if maxEntries <= 0 || maxBytes <= 0 || ttl <= 0 {
		return nil
	}
	return &replayCache{maxEntries: maxEntries, maxBytes: maxBytes, ttl: ttl, now: time.Now,
		entries: map[replayKey]*list.Element{}, order: list.New()}
}

// get returns the outcome cached for (scope, key) when its fingerprint is
// fingerprint and it has not expired. A different fingerprint is a miss:
// the Dedupe service answers it (fingerprint_mismatch).
func (c *replayCache) get(scope, key string, fingerprint []byte) (cachedOutcome, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[replayKey{scope, key}]
	if !ok {
		return cachedOutcome{}, false
	}
	e := el.Value.(*replayEntry)
	if !c.now().Before(e.until) {
		c.remove(el)
		return cachedOutcome{}, false
	}
	if !bytes.Equal(e.fingerprint, fingerprint) {
		return cachedOutcome{}, false
	}
	c.order.MoveToFront(el)
	return e.cachedOutcome, true
}

// put caches a completed outcome. Its outcome is shared with every
// duplicate served from it, so neither the caller nor the cache may change
// it afterwards.
func (c *replayCache) put(scope, key string, fingerprint []byte, stored cachedOutcome) {
	now := c.now()
	until := now.Add(c.ttl)
	if last := stored.expiresAt.Add(-ReplayCacheClockMargin); last.Before(until) {
		until = last
	}
	if !now.Before(until) {
		return
	}
	outcome := stored.outcome
	size := replayEntryOverhead + len(scope) + len(key) + len(fingerprint) + len(outcome.GetTypeUrl()) + len(outcome.GetValue())
	if size > c.maxBytes {
		return
	}
	id := replayKey{scope, key}
	e := &replayEntry{id: id, cachedOutcome: stored, fingerprint: fingerprint, until: until, size: size}
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

func (c *replayCache) remove(el *list.Element) {
	e := c.order.Remove(el).(*replayEntry)
	delete(c.entries, e.id)
	c.bytes -= e.size
}

// len returns the number of entries and their bytes.
func (c *replayCache) len() (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.bytes
}

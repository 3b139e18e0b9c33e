package dedupesvc

import (
	"context"
	"sync"
	"time"
)

// UsageLister is a Store that lists its namespaces' quota usage a page at a
// time, by namespace: the operator console's Tenants page reads it.
type UsageLister interface {
	// ListNamespaceUsage returns up to limit namespaces named after after
	// (from the first, the namespace "" included, when after is ""), in
	// order, with their usage as NamespaceUsage reads it; namespaces
	// holding nothing are left out.
	ListNamespaceUsage(ctx context.Context, after string, limit int) ([]NamespaceUsage, error)
}

// NamespaceUsage is one namespace's usage of the caller quotas
// (WithCallerQuota): its stored records, expired ones until swept, and
// their outcome bytes.
type NamespaceUsage struct {
	Namespace             string
	Records, OutcomeBytes int64
}

// UsageReader is a Store that reads one namespace's quota usage on its own:
// what Store.Begin checks a quota against (pgstore: the compacted totals
// plus the changes not yet compacted; sqlitestore: its totals). The Server
// reads it for each busy namespace about once a second (usageLedger), so
// that a Begin far below its caller's quotas skips the store's usage read.
type UsageReader interface {
	// NamespaceUsage returns how many records and stored outcome bytes the
	// namespace holds, as one statement's snapshot sees them.
	NamespaceUsage(ctx context.Context, namespace string) (records, outcomeBytes int64, err error)
}

// Usage ledger tuning. A read older than usageReadStale, or none, sends a
// Begin to the store's own check.
const (
	// usageReadEvery is how often a busy namespace's usage is read again.
	usageReadEvery = DefaultUsageCompactionInterval
	// usageReadStale is how old a read may be and still let a Begin skip
	// the store's check: a few missed reads (a slow or failing store)
	// fall back to the exact check.
	usageReadStale = 5 * usageReadEvery
	// usageReadTimeout bounds one read.
	usageReadTimeout = 5 * time.Second
	// maxUsageReads bounds the reads in flight at once, across namespaces.
	maxUsageReads = 4
	// maxLedgerNamespaces bounds the namespaces kept; past it, a namespace
	// not kept takes the store's check.
	maxLedgerNamespaces = 10000
)

// usageLedger keeps each busy namespace's usage as last read from the
// store, plus what this replica reserved and stored since, so that a Begin
// whose caller is far below its quotas asks the store to skip its own usage
// read (BeginParams with no quota). On one PostgreSQL that read walks the
// caller's usage changes not yet compacted, whose dead rows pile up when
// vacuum falls behind; on Citus it reads every shard. Near a quota, or
// without a recent read, a Begin keeps the store's exact check, which also
// answers duplicates of a caller at its quota.
//
// The estimate only errs high for this replica's own work: a reservation
// counts from the moment it is admitted, and one that lands in the next
// read too is counted twice until the read after. What it cannot see are
// other replicas' reservations since the last read; a namespace's growth
// between its last two reads (all replicas' work in one interval) is kept
// as a margin below the quota, inside which every Begin takes the exact
// check. Counts are updated under a per-namespace lock held for a few
// instructions, never across a store call.
type usageLedger struct {
	reader UsageReader
	// now is the clock, time.Now outside tests.
	now func() time.Time
	// reads bounds the reads in flight (maxUsageReads).
	reads chan struct{}

	mu sync.Mutex
	m  map[string]*namespaceUsage
}

// namespaceUsage is one namespace's entry, under its own mu.
type namespaceUsage struct {
	mu sync.Mutex
	// read says records and bytes hold a read, sent at readAt.
	read           bool
	records, bytes int64
	readAt         time.Time
	// reading says a read is in flight.
	reading bool
	// reserved counts this replica's reservations that returned, ever;
	// reservedAtRead its value when the last read was sent, so
	// reserved-reservedAtRead are the ones the read may have missed.
	reserved, reservedAtRead int64
	// stored and storedAtRead count outcome bytes this replica stored,
	// the same way.
	stored, storedAtRead int64
	// inFlight counts Begins admitted and not yet returned; fastInFlight
	// those of them that skip the store's check.
	inFlight, fastInFlight int64
	// checking counts Begins waiting for those to land before the store's
	// check (none skips it meanwhile); landed is closed when they have.
	checking int
	landed   chan struct{}
	// marginRecords and marginBytes are what the namespace grew by between
	// its last two reads beyond this replica's own work: other replicas'.
	marginRecords, marginBytes int64
	// usedAt is when a Begin last asked, for eviction.
	usedAt time.Time
}

func newUsageLedger(reader UsageReader) *usageLedger {
	return &usageLedger{reader: reader, now: time.Now, reads: make(chan struct{}, maxUsageReads), m: map[string]*namespaceUsage{}}
}

// admit decides for a Begin of ns whether the store may skip its quota
// check: it returns p with no quotas when the namespace is far enough below
// them, p unchanged otherwise, and done, which the caller must call with
// whether the Begin reserved. Every Begin is counted in flight meanwhile,
// so concurrent Begins of one replica never pass a quota between them on
// the fast path. The store's check sees only committed reservations, so a
// Begin that takes it first waits for this replica's Begins skipping it to
// land (a store round trip; new ones are not let skip it meanwhile), or
// for ctx, whose error it then returns. A nil ledger or a Begin without
// quotas passes p through.
func (l *usageLedger) admit(ctx context.Context, p BeginParams) (BeginParams, func(reserved bool), error) {
	if l == nil || (p.MaxRecords <= 0 && p.MaxOutcomeBytes <= 0) {
		return p, func(bool) {}, nil
	}
	e := l.entry(p.Namespace)
	if e == nil {
		return p, func(bool) {}, nil
	}
	now := l.now()
	e.mu.Lock()
	e.usedAt = now
	fresh := e.read && now.Sub(e.readAt) < usageReadStale
	fast := fresh && e.checking == 0 &&
		(p.MaxRecords <= 0 || e.records+(e.reserved-e.reservedAtRead)+e.inFlight+e.marginRecords+1 <= p.MaxRecords) &&
		(p.MaxOutcomeBytes <= 0 || e.bytes+(e.stored-e.storedAtRead)+e.marginBytes < p.MaxOutcomeBytes)
	e.inFlight++
	var landed chan struct{}
	if fast {
		e.fastInFlight++
	} else if e.fastInFlight > 0 {
		if e.landed == nil {
			e.landed = make(chan struct{})
		}
		landed = e.landed
		e.checking++
	}
	readNow := !e.reading && (!e.read || now.Sub(e.readAt) >= usageReadEvery)
	if readNow {
		readNow = l.startRead()
		e.reading = readNow
	}
	e.mu.Unlock()
	if readNow {
		go l.readUsage(p.Namespace, e)
	}
	done := func(reserved bool) {
		e.mu.Lock()
		e.inFlight--
		if fast {
			if e.fastInFlight--; e.fastInFlight == 0 && e.landed != nil {
				close(e.landed)
				e.landed = nil
			}
		}
		if reserved {
			e.reserved++
		}
		e.mu.Unlock()
	}
	if landed != nil {
		var err error
		select {
		case <-landed:
		case <-ctx.Done():
			err = ctx.Err()
		}
		e.mu.Lock()
		e.checking--
		e.mu.Unlock()
		if err != nil {
			done(false)
			return p, nil, err
		}
	}
	if fast {
		p.MaxRecords, p.MaxOutcomeBytes = 0, 0
	}
	return p, done, nil
}

// stored counts n outcome bytes this replica stored for ns.
func (l *usageLedger) storedBytes(ns string, n int) {
	if l == nil || n <= 0 {
		return
	}
	l.mu.Lock()
	e := l.m[ns]
	l.mu.Unlock()
	if e == nil {
		return // not kept: its next read sees them
	}
	e.mu.Lock()
	e.stored += int64(n)
	e.mu.Unlock()
}

// entry is ns's entry, made on first use; nil when the ledger is full of
// namespaces in use.
func (l *usageLedger) entry(ns string) *namespaceUsage {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.m[ns]; ok {
		return e
	}
	if len(l.m) >= maxLedgerNamespaces {
		l.evictIdle()
		if len(l.m) >= maxLedgerNamespaces {
			return nil
		}
	}
	e := &namespaceUsage{}
	l.m[ns] = e
	return e
}

// evictIdle drops the entries no Begin used for usageReadStale and none
// holds: they would need a fresh read anyway. Under l.mu.
func (l *usageLedger) evictIdle() {
	cutoff := l.now().Add(-usageReadStale)
	for ns, e := range l.m {
		e.mu.Lock()
		idle := e.inFlight == 0 && !e.reading && e.usedAt.Before(cutoff)
		e.mu.Unlock()
		if idle {
			delete(l.m, ns)
		}
	}
}

// startRead takes a place for a read, if one is free.
func (l *usageLedger) startRead() bool {
	select {
	case l.reads <- struct{}{}:
		return true
	default:
		return false
	}
}

// readUsage reads ns's usage into e. A failed read leaves the last one,
// which goes stale (usageReadStale) if the store stays away.
func (l *usageLedger) readUsage(ns string, e *namespaceUsage) {
	defer func() { <-l.reads }()
	e.mu.Lock()
	sentAt, reservedAt, storedAt := l.now(), e.reserved, e.stored
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), usageReadTimeout)
	records, bytes, err := l.reader.NamespaceUsage(ctx, ns)
	cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reading = false
	if err != nil {
		return
	}
	if e.read {
		// What the namespace grew by beyond this replica's own reservations
		// and bytes since the last read: other replicas' work in about one
		// interval, kept as a margin below the quota.
		e.marginRecords = max(0, records-e.records-(reservedAt-e.reservedAtRead))
		e.marginBytes = max(0, bytes-e.bytes-(storedAt-e.storedAtRead))
	}
	e.read, e.records, e.bytes, e.readAt = true, records, bytes, sentAt
	e.reservedAtRead, e.storedAtRead = reservedAt, storedAt
}

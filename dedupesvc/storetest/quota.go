package storetest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
)

// QuotaOvershooter is a store whose records quota may be overshot by the
// reservations committing at the same moment (pgstore: each transaction
// sees only committed ones); MaxQuotaOvershoot bounds by how many, for one
// replica. A store that is none keeps its quotas exactly.
type QuotaOvershooter interface {
	MaxQuotaOvershoot() int
}

// testRecordsQuotaConcurrent: 1,000 concurrent Begins of fresh keys against
// a records quota of 200, with no compaction meanwhile, reserve at least
// 200 and at most 200 plus the store's stated overshoot (0 unless it is a
// QuotaOvershooter): a store counts a caller's reservations as they commit,
// not only as compacted.
func testRecordsQuotaConcurrent(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()
	s := newStore(t)
	const limit, begins = 200, 1000
	bound := 0
	if o, ok := s.(QuotaOvershooter); ok {
		bound = o.MaxQuotaOvershoot()
	}
	var (
		wg       sync.WaitGroup
		reserved atomic.Int64
	)
	for i := range begins {
		wg.Go(func() {
			p := begin("t", fpA, long, long)
			p.Namespace, p.Key, p.MaxRecords = "greedy", fmt.Sprint("k", i), limit
			res, err := s.Begin(ctx, p)
			switch {
			case errors.Is(err, dedupesvc.ErrQuotaExceeded):
			case err != nil || res.State != dedupesvc.BeginReserved:
				t.Errorf("Begin = %+v, %v", res, err)
			default:
				reserved.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("%d concurrent Begins against a records quota of %d: %d reserved (stated bound %d over)", begins, limit, reserved.Load(), bound)
	if n := reserved.Load(); n < limit || n > limit+int64(bound) {
		t.Fatalf("%d concurrent Begins against a records quota of %d reserved %d, want %d to %d", begins, limit, n, limit, limit+bound)
	}
}

// testUsageList lists every namespace's usage a page at a time, as the
// operator console's Tenants page does: each namespace once, in order (the
// unauthenticated callers' "" first),
// with the usage NamespaceUsage reads (on a UsageReader), compacted or
// not.
func testUsageList(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()
	s := newStore(t)
	lister, ok := s.(dedupesvc.UsageLister)
	if !ok {
		t.Skip("the store is no UsageLister")
	}
	for i, ns := range []string{"", "billing", "mail", "crm"} {
		for k := range i + 1 {
			p := begin("t", fpA, long, long)
			p.Namespace, p.Key = ns, fmt.Sprint("k", k)
			mustBegin(t, s, p, dedupesvc.BeginReserved)
		}
		if ns == "mail" {
			settleUsage(t, s) // one namespace compacted, the others not
		}
	}
	var listed []dedupesvc.NamespaceUsage
	after := ""
	for {
		page, err := lister.ListNamespaceUsage(ctx, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, page...)
		if len(page) < 2 {
			break
		}
		after = page[len(page)-1].Namespace
	}
	if got := fmt.Sprint(listed); got != "[{ 1 0} {billing 2 0} {crm 4 0} {mail 3 0}]" {
		t.Fatalf("listed usage %s, want \"\" 1, billing 2, crm 4, mail 3 records", got)
	}
	reader, ok := s.(dedupesvc.UsageReader)
	for _, u := range listed {
		if !ok {
			break
		}
		records, bytes, err := reader.NamespaceUsage(ctx, u.Namespace)
		if err != nil || records != u.Records || bytes != u.OutcomeBytes {
			t.Fatalf("%s: listed %d records, %d bytes; NamespaceUsage reads %d, %d (%v)", u.Namespace, u.Records, u.OutcomeBytes, records, bytes, err)
		}
	}
}

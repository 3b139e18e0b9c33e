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

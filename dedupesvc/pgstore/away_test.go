package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// TestConnectsWhileTheStoreIsAwayAreBounded: callers that keep calling
// Begin while the database is away fail at once with the store's error,
// but the replica connects only about once per resume backoff, not once per
// Begin; once the database is back, a Begin after the backoff's cap
// succeeds. The proxy accepts and closes every connection, as a database
// going down or a balancer in front of a dead one does, so each connect
// costs it one accept (two with sslmode=prefer, which retries without TLS).
func TestConnectsWhileTheStoreIsAwayAreBounded(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Schema(t)
	replica, px := proxiedStore(t, schema)
	if res, err := replica.Begin(ctx, begin("warm")); err != nil || res.State != dedupesvc.BeginReserved {
		t.Fatalf("Begin = %+v, %v; want reserved", res, err)
	}
	px.cut(true)
	before := px.accepts.Load()
	start := time.Now()
	const callers = 16
	var (
		begins atomic.Int64
		wrong  atomic.Pointer[string]
		stop   atomic.Bool
		wg     sync.WaitGroup
	)
	for i := range callers {
		wg.Go(func() {
			for n := 0; !stop.Load(); n++ {
				p := begin("away")
				p.Key = fmt.Sprintf("away-%d-%d", i, n)
				c, cancel := context.WithTimeout(ctx, 30*time.Second)
				res, err := replica.Begin(c, p)
				cancel()
				begins.Add(1)
				time.Sleep(time.Millisecond) // a caller's pace, not a spin
				if err == nil || !pgstore.UnreachableForTest(ctx, err) {
					problem := fmt.Sprintf("a Begin while the store is away = %+v, %v; want the store's error", res, err)
					wrong.CompareAndSwap(nil, &problem)
				}
			}
		})
	}
	time.Sleep(3 * time.Second)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	dials := px.accepts.Load() - before
	t.Logf("%d Begins and %d connects in %v while the store was away: %.1f connects a second",
		begins.Load(), dials, elapsed.Round(time.Millisecond), float64(dials)/elapsed.Seconds())
	if p := wrong.Load(); p != nil {
		t.Error(*p)
	}
	// One try per backoff, at least half the cap apart once at the cap
	// (after about six shorter ones), plus one per caller already on its
	// way when the store went: doubled, for sslmode=prefer's second dial
	// and for slack. A machine however slow only makes fewer.
	backoffCap := pgstore.ResumeBackoffCapForTest
	limit := 2 * (callers + 8 + int64(elapsed/(backoffCap/2)))
	if dials > limit {
		t.Errorf("%d connects in %v while the store was away, want at most %d", dials, elapsed, limit)
	}
	if begins.Load() <= dials {
		t.Errorf("%d Begins made %d connects: every Begin tried the store, none failed at once", begins.Load(), dials)
	}

	px.cut(false)
	// The last backoff began before the store came back, so it ended
	// within the cap.
	time.Sleep(backoffCap + 100*time.Millisecond)
	p := begin("back")
	p.Key = "back"
	if res, err := replica.Begin(ctx, p); err != nil || res.State != dedupesvc.BeginReserved {
		t.Fatalf("Begin once the store is back = %+v, %v; want reserved", res, err)
	}
}

// TestRefusedConnectsAreBounded: a replica whose database refuses
// connections (nothing listens on its port) from the start dials it about
// once per resume backoff however many Begins fail meanwhile, each with the
// store's error.
func TestRefusedConnectsAreBounded(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().(*net.TCPAddr)
	lis.Close()
	cfg, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", addr.Port))
	if err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int64
	dial := pgstore.RejectSelfConnects(cfg.ConnConfig.DialFunc)
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, addr)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := pgstore.New(pool)
	const callers = 16
	var (
		begins atomic.Int64
		wrong  atomic.Pointer[string]
		stop   atomic.Bool
		wg     sync.WaitGroup
	)
	start := time.Now()
	for i := range callers {
		wg.Go(func() {
			for n := 0; !stop.Load(); n++ {
				p := begin("refused")
				p.Key = fmt.Sprintf("refused-%d-%d", i, n)
				res, err := s.Begin(ctx, p)
				begins.Add(1)
				time.Sleep(time.Millisecond)
				if err == nil || !pgstore.UnreachableForTest(ctx, err) || !errors.Is(err, dedupesvc.ErrNotSent) {
					problem := fmt.Sprintf("a Begin while connections are refused = %+v, %v; want the store's error, marked as having sent nothing (ErrNotSent)", res, err)
					wrong.CompareAndSwap(nil, &problem)
				}
			}
		})
	}
	time.Sleep(3 * time.Second)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("%d Begins and %d refused dials in %v: %.1f dials a second",
		begins.Load(), dials.Load(), elapsed.Round(time.Millisecond), float64(dials.Load())/elapsed.Seconds())
	if p := wrong.Load(); p != nil {
		t.Error(*p)
	}
	// As in TestConnectsWhileTheStoreIsAwayAreBounded.
	if limit := 2 * (callers + 8 + int64(elapsed/(pgstore.ResumeBackoffCapForTest/2))); dials.Load() > limit {
		t.Errorf("%d dials in %v while connections were refused, want at most %d", dials.Load(), elapsed, limit)
	}
}

package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// TestRowsOfThePreviousVersionKeepWorking writes rows as the version before
// migration 003 did (no lease_ms) and has them read, renewed, finished and
// replayed.
func TestRowsOfThePreviousVersionKeepWorking(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	s := pgstore.New(pool)
	p := begin("t1")
	if _, err := pool.Exec(ctx, `
INSERT INTO idemgate_records (scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    retention_ms, lease_expires_at, expires_at)
VALUES ($1, $2, $3, 'in_flight', 't1', 1, 3600000, now() + interval '1 hour', now() + interval '1 hour')`,
		p.Scope, p.Key, p.Fingerprint); err != nil {
		t.Fatal(err)
	}
	var leaseMS int64
	if err := pool.QueryRow(ctx, `SELECT lease_ms FROM idemgate_records`).Scan(&leaseMS); err != nil || leaseMS != 10000 {
		t.Fatalf("an old row's lease_ms = %d, %v; want the default 10000", leaseMS, err)
	}
	if res, err := s.Begin(ctx, reexecute(begin("t2"))); err != nil || res.State != dedupesvc.BeginInFlight {
		t.Fatalf("Begin on an old row = %+v, %v; want in flight", res, err)
	}
	if res, err := s.Begin(ctx, p); err != nil || res.State != dedupesvc.BeginReserved || res.Epoch != 1 {
		t.Fatalf("the old holder's retried Begin = %+v, %v; want reserved, epoch 1", res, err)
	}
	if _, err := s.Heartbeat(ctx, dedupesvc.HeartbeatParams{Scope: p.Scope, Key: p.Key, AttemptToken: "t1", Epoch: 1, Lease: time.Minute}); err != nil {
		t.Fatalf("Heartbeat on an old row: %v", err)
	}
	outcome := dedupesvc.Outcome{TypeURL: "type.googleapis.com/test.A", Value: []byte("A")}
	if err := s.Finish(ctx, dedupesvc.FinishParams{Scope: p.Scope, Key: p.Key, AttemptToken: "t1", Epoch: 1, Outcome: outcome}); err != nil {
		t.Fatalf("Finish on an old row: %v", err)
	}
	if res, err := s.Begin(ctx, begin("t3")); err != nil || res.State != dedupesvc.BeginCompleted || string(res.Outcome.Value) != "A" {
		t.Fatalf("replay of an old row = %+v, %v", res, err)
	}
}

func reexecute(p dedupesvc.BeginParams) dedupesvc.BeginParams {
	p.OnLostOutcome = dedupesvc.Reexecute
	return p
}

// proxy forwards TCP connections to the database until cut, which closes
// every connection and refuses new ones (it accepts and closes them at once),
// as a database that went away would. accepts counts the connections it
// accepted, up or down: the dials that reached it.
type proxy struct {
	lis     net.Listener
	target  string
	accepts atomic.Int64
	mu      sync.Mutex
	down    bool
	conns   []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{lis: lis, target: target}
	t.Cleanup(func() { lis.Close(); p.cut(true) })
	go p.serve()
	return p
}

func (p *proxy) serve() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.accepts.Add(1)
		p.mu.Lock()
		down := p.down
		if !down {
			p.conns = append(p.conns, c)
		}
		p.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, up)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		go func() { _, _ = io.Copy(c, up); c.Close() }()
	}
}

// cut takes the database away (true) or brings it back (false).
func (p *proxy) cut(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// TestAReplicaThatSawTheDatabaseGoAwayGrantsTheGrace: a replica whose
// statement failed because the database could not be reached marks the store
// resumed before its next decision, so a lease that ran out during the outage
// is not taken over at once, although the database itself never restarted.
func TestAReplicaThatSawTheDatabaseGoAwayGrantsTheGrace(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	other := pgstore.New(pool) // a replica that saw nothing
	const lease = time.Second
	for range 3 {
		holder := begin("holder")
		holder.Key, holder.Lease = "key-"+time.Now().Format("150405.000000"), lease
		held, err := other.Begin(ctx, holder)
		if err != nil || held.State != dedupesvc.BeginReserved {
			t.Fatalf("Begin = %+v, %v", held, err)
		}

		replica, px := proxiedStore(t, schema)
		taker := reexecute(begin("taker"))
		taker.Key = holder.Key
		time.Sleep(lease + 200*time.Millisecond)
		px.cut(true)
		// The holder cannot renew through this replica: the database is away.
		_, err = replica.Heartbeat(ctx, dedupesvc.HeartbeatParams{Scope: holder.Scope, Key: holder.Key, AttemptToken: "holder", Epoch: held.Epoch, Lease: lease})
		if err == nil || errors.Is(err, dedupesvc.ErrNotHeld) {
			t.Fatalf("Heartbeat through a cut proxy: %v, want a store failure", err)
		}
		px.cut(false)
		back := time.Now()
		res, err := replica.Begin(ctx, taker)
		if time.Since(back) >= lease {
			t.Logf("the Begin took %v, longer than the grace; trying again", time.Since(back))
			continue
		}
		if err != nil || res.State != dedupesvc.BeginInFlight {
			t.Fatalf("REEXECUTE Begin after the outage = %+v, %v; want in flight (the grace)", res, err)
		}
		// The other replica, which saw nothing, honours the grace too.
		if res, err := other.Begin(ctx, taker); err != nil || res.State != dedupesvc.BeginInFlight {
			t.Fatalf("the other replica's Begin = %+v, %v; want in flight", res, err)
		}
		return
	}
	t.Skip("the machine never ran the Begin within the grace")
}

// TestAFailureThatIsNoOutageGrantsNoGrace: a caller that gave up, and an
// ordinary SQL error, leave the resume time alone.
func TestAFailureThatIsNoOutageGrantsNoGrace(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	s := pgstore.New(pool)
	var before time.Time
	if err := pool.QueryRow(ctx, `SELECT resumed_at FROM idemgate_store_state`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Begin(cancelled, begin("t1")); err == nil {
		t.Fatal("Begin with a cancelled context succeeded")
	}
	bad := begin("t1")
	bad.Scope = "nul\x00byte" // refused by the database: invalid byte sequence
	if _, err := s.Begin(ctx, bad); err == nil {
		t.Fatal("Begin with a NUL in the scope succeeded")
	}
	if res, err := s.Begin(ctx, begin("t1")); err != nil || res.State != dedupesvc.BeginReserved {
		t.Fatalf("Begin = %+v, %v", res, err)
	}
	var after time.Time
	if err := pool.QueryRow(ctx, `SELECT resumed_at FROM idemgate_store_state`).Scan(&after); err != nil || !after.Equal(before) {
		t.Fatalf("resumed_at moved from %v to %v (%v); want it unchanged", before, after, err)
	}
}

// proxiedStore is a replica whose connections go through a proxy the test
// can cut.
func proxiedStore(t *testing.T, schema string) (*pgstore.Store, *proxy) {
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	addr := px.lis.Addr().(*net.TCPAddr)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = addr.IP.String(), uint16(addr.Port)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pgstore.New(pool), px
}

// abandonedAfterOutage returns a replica that saw the database go away (a
// statement of it failed through its cut proxy, which is up again), on a
// schema whose key-1 is in flight for "holder" with a lease that ran out an
// hour ago, its expiry at expires, and whose last resume is an hour old:
// only a mark of this replica's outage grants the grace. The record's
// lease_ms is as long as PostgreSQL has run (up to ten minutes, so its
// restart grants nothing), which outlasts any starved test.
func abandonedAfterOutage(t *testing.T, expires string) (*pgxpool.Pool, *pgstore.Store, *proxy) {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	var leaseMS int64
	if err := pool.QueryRow(ctx, `SELECT least(600000, (extract(epoch FROM now() - pg_postmaster_start_time()) * 1000)::bigint - 2000)`).Scan(&leaseMS); err != nil || leaseMS < 20000 {
		t.Fatalf("PostgreSQL started %dms ago (%v): too recently for its restart grace not to hide the replica's", leaseMS+2000, err)
	}
	p := begin("holder")
	if _, err := pool.Exec(ctx, `
INSERT INTO idemgate_records (scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    retention_ms, lease_ms, lease_expires_at, expires_at)
VALUES ($1, $2, $3, 'in_flight', 'holder', 1, 3600000, $5, now() - interval '1 hour', now() + $4::interval)`,
		p.Scope, p.Key, p.Fingerprint, expires, leaseMS); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idemgate_store_state SET resumed_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	replica, px := proxiedStore(t, schema)
	px.cut(true)
	if _, err := replica.Heartbeat(ctx, dedupesvc.HeartbeatParams{Scope: p.Scope, Key: p.Key, AttemptToken: "holder", Epoch: 1, Lease: time.Minute}); err == nil || errors.Is(err, dedupesvc.ErrNotHeld) {
		t.Fatalf("Heartbeat through a cut proxy: %v, want a store failure", err)
	}
	px.cut(false)
	return pool, replica, px
}

// holdMark makes the replica's next MarkResumed wait until the returned
// release is called; entered is closed once a mark is held.
func holdMark(s *pgstore.Store) (entered <-chan struct{}, release func()) {
	in, out := make(chan struct{}), make(chan struct{})
	var once sync.Once
	pgstore.HoldMarkForTest(s, func(context.Context) {
		first := false
		once.Do(func() { first = true; close(in) })
		if first {
			<-out
		}
	})
	return in, func() { close(out) }
}

// whileMarkPending starts op while the replica's mark is held and returns
// its result once op either answered (while the mark was still pending) or
// waits for the mark, together with whether it answered before the mark
// ended.
func whileMarkPending(t *testing.T, s *pgstore.Store, waiting int, op func() error) (early bool, done <-chan error) {
	t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- op() }()
	for {
		select {
		case err := <-ch:
			ch <- err
			return true, ch
		default:
		}
		if pgstore.WaitingForMarkForTest(s) >= waiting {
			return false, ch
		}
		time.Sleep(time.Millisecond)
	}
}

// TestOperationsWaitForThePendingResumeMark: a Begin, Resolve or sweep on a
// replica that saw the database go away, while its mark of the resume is
// still pending, waits for the mark and then honours the grace: it never
// decides on the old resume time.
func TestOperationsWaitForThePendingResumeMark(t *testing.T) {
	t.Parallel()
	_, replica, _ := abandonedAfterOutage(t, "1 hour")
	entered, release := holdMark(replica)
	marker := make(chan error, 1)
	go func() {
		_, err := replica.Heartbeat(ctx, dedupesvc.HeartbeatParams{Scope: "/pkg.S/M", Key: "key-1", AttemptToken: "nobody", Epoch: 1, Lease: time.Minute})
		marker <- err
	}()
	<-entered

	var takeover, unknown dedupesvc.BeginResult
	ops := []struct {
		name string
		run  func() error
		want func(error) string
	}{
		{"REEXECUTE Begin", func() (err error) { takeover, err = replica.Begin(ctx, reexecute(begin("taker"))); return err }, func(err error) string {
			if err != nil || takeover.State != dedupesvc.BeginInFlight {
				return fmt.Sprintf("= %+v, %v; want in flight (the grace)", takeover, err)
			}
			return ""
		}},
		{"FAIL_CLOSED Begin", func() (err error) { unknown, err = replica.Begin(ctx, begin("duplicate")); return err }, func(err error) string {
			if err != nil || unknown.State != dedupesvc.BeginInFlight {
				return fmt.Sprintf("= %+v, %v; want in flight (the grace)", unknown, err)
			}
			return ""
		}},
		{"Resolve", func() error { return replica.Resolve(ctx, dedupesvc.ResolveParams{Scope: "/pkg.S/M", Key: "key-1"}) }, func(err error) string {
			if !errors.Is(err, dedupesvc.ErrNotUnknown) {
				return fmt.Sprintf("= %v; want ErrNotUnknown (the grace)", err)
			}
			return ""
		}},
	}
	var dones []<-chan error
	for i, op := range ops {
		early, done := whileMarkPending(t, replica, i+1, op.run)
		if early {
			t.Errorf("%s answered while the mark was pending: %s", op.name, op.want(<-done))
			done = nil
		}
		dones = append(dones, done)
	}
	release()
	if err := <-marker; !errors.Is(err, dedupesvc.ErrNotHeld) {
		t.Fatalf("the marking Heartbeat: %v, want ErrNotHeld", err)
	}
	for i, op := range ops {
		if dones[i] == nil {
			continue
		}
		if problem := op.want(<-dones[i]); problem != "" {
			t.Errorf("%s after the mark %s", op.name, problem)
		}
	}
}

// TestAFailedResumeMarkFailsTheWaitingOperations: when the mark itself
// cannot reach the database, the operations that waited for it fail with a
// store error instead of deciding, and the first operation after the
// backoff marks again.
func TestAFailedResumeMarkFailsTheWaitingOperations(t *testing.T) {
	t.Parallel()
	_, replica, px := abandonedAfterOutage(t, "1 hour")
	entered, release := holdMark(replica)
	marker := make(chan error, 1)
	go func() {
		_, err := replica.Begin(ctx, begin("duplicate"))
		marker <- err
	}()
	<-entered
	var res dedupesvc.BeginResult
	early, done := whileMarkPending(t, replica, 1, func() (err error) { res, err = replica.Begin(ctx, reexecute(begin("taker"))); return err })
	px.cut(true)
	release()
	err := <-done
	if early || err == nil {
		t.Fatalf("REEXECUTE Begin while a failing mark was pending = %+v, %v (answered before the mark ended: %v); want the mark's store error", res, err, early)
	}
	if err := <-marker; err == nil {
		t.Fatal("the Begin whose mark failed succeeded")
	}
	px.cut(false)
	pgstore.HoldMarkForTest(replica, nil)
	// Until the backoff since the failed mark runs out, operations fail at
	// once with its error.
	time.Sleep(pgstore.ResumeBackoffCapForTest)
	if res, err := replica.Begin(ctx, reexecute(begin("taker"))); err != nil || res.State != dedupesvc.BeginInFlight {
		t.Fatalf("REEXECUTE Begin once the database is back = %+v, %v; want in flight (marked again, the grace)", res, err)
	}
}

// TestTheSweeperMarksTheResumeFirst: a replica's sweep after it saw the
// database go away keeps an in-flight record past its expiry whose lease
// ran out during the outage, as the grace says.
func TestTheSweeperMarksTheResumeFirst(t *testing.T) {
	t.Parallel()
	pool, replica, _ := abandonedAfterOutage(t, "-1 minute")
	if n, _, err := replica.DeleteExpired(ctx, 10); err != nil || n != 0 {
		t.Fatalf("DeleteExpired after the outage = %d, %v; want the record kept for the grace", n, err)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idemgate_records`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d records (%v), want the in-flight one kept", rows, err)
	}
}

// TestAStuckSweeperMarkDoesNotStallTheReplica: the sweeper, whose context
// never ends, becomes the marker of the resume and its mark hangs (on a
// connection the network dropped, as TCP can for minutes); a Begin that
// waits for that mark goes on once the database answers, within its own
// deadline, and honours the grace, and the sweep ends too.
func TestAStuckSweeperMarkDoesNotStallTheReplica(t *testing.T) {
	t.Parallel()
	_, replica, _ := abandonedAfterOutage(t, "1 hour")
	entered := make(chan struct{})
	var (
		once  sync.Once
		marks sync.WaitGroup
	)
	marks.Add(1)
	pgstore.HoldMarkForTest(replica, func(c context.Context) {
		first := false
		once.Do(func() { first = true; close(entered) })
		if first {
			<-c.Done() // the dropped connection answers nothing
			marks.Done()
		}
	})
	sweep := make(chan error, 1)
	go func() {
		_, err := replica.MarkLostOutcomes(context.Background(), 10)
		sweep <- err
	}()
	<-entered
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := replica.Begin(c, reexecute(begin("taker")))
	if err != nil || res.State != dedupesvc.BeginInFlight {
		t.Fatalf("REEXECUTE Begin while the sweeper's mark hangs = %+v, %v; want in flight (marked again, the grace)", res, err)
	}
	if err := <-sweep; err != nil {
		t.Fatalf("the sweep whose mark hung: %v, want it to go on once the store is marked", err)
	}
	marks.Wait()
}

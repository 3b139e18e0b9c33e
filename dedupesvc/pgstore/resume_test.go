package pgstore_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/internal/pgtest"
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
// as a database that went away would.
type proxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  []net.Conn
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

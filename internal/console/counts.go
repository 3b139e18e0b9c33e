package console

import (
	"context"
	"log/slog"
	"sync"
	"time"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// recountTimeout bounds a count run in the background: it scans every
// record, seconds at most on a large store.
const recountTimeout = 2 * time.Minute

// counts keeps the overview's last count of records by state and method.
// Counting scans every record (220 ms a million on the 2-core test
// machine), so a page shows the last count and, once it is older than
// maxAge, starts one recount in the background: no page waits on a scan
// except the first after start, and the store runs one count at a time
// however many operators reload the overview.
type counts struct {
	admin  idemgatev1.AdminServiceServer
	maxAge time.Duration
	logger *slog.Logger
	// base ends a recount under way when the console closes (close).
	base context.Context
	stop context.CancelFunc

	mu   sync.Mutex
	last countSnapshot
	// running is closed when the count under way ends; nil when none is.
	running chan struct{}
}

// countSnapshot is one count and when it was made.
type countSnapshot struct {
	Counts *idemgatev1.CountRecordsResponse
	// At is when the count began; Took how long it ran.
	At   time.Time
	Took time.Duration
	// Err is why the last recount failed, when it did: Counts are older.
	Err error
}

// get returns the last count, starting a recount when it is older than
// maxAge; with none yet, it waits for one (or for ctx). A negative maxAge
// counts now, every time.
func (c *counts) get(ctx context.Context) (countSnapshot, error) {
	if c.maxAge < 0 {
		return c.count(ctx)
	}
	c.mu.Lock()
	last, running := c.last, c.running
	if running == nil && (last.Counts == nil || time.Since(last.At) > c.maxAge) {
		running = make(chan struct{})
		c.running = running
		// Not the request's context: the recount outlives a page that
		// does not wait for it, not the console (base).
		go c.recount(c.base, running)
	}
	c.mu.Unlock()
	if last.Counts != nil {
		return last, nil
	}
	select {
	case <-running:
	case <-ctx.Done():
		return countSnapshot{}, ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last.Counts == nil {
		return countSnapshot{}, c.last.Err
	}
	return c.last, nil
}

// close ends a recount under way and waits for it, so none runs on a
// store the service is closing.
func (c *counts) close() {
	c.stop()
	c.mu.Lock()
	running := c.running
	c.mu.Unlock()
	if running != nil {
		<-running
	}
}

func (c *counts) recount(ctx context.Context, done chan struct{}) {
	ctx, cancel := context.WithTimeout(ctx, recountTimeout)
	defer cancel()
	snap, err := c.count(ctx)
	c.mu.Lock()
	if err != nil {
		c.logger.WarnContext(ctx, "console: counting the records failed", slog.Any("error", err))
		c.last.Err = err
	} else {
		c.last = snap
	}
	c.running = nil
	c.mu.Unlock()
	close(done)
}

func (c *counts) count(ctx context.Context) (countSnapshot, error) {
	start := time.Now()
	resp, err := c.admin.CountRecords(ctx, &idemgatev1.CountRecordsRequest{})
	if err != nil {
		return countSnapshot{}, err
	}
	return countSnapshot{Counts: resp, At: start, Took: time.Since(start)}, nil
}

func newCounts(admin idemgatev1.AdminServiceServer, maxAge time.Duration, logger *slog.Logger) *counts {
	base, stop := context.WithCancel(context.Background())
	return &counts{admin: admin, maxAge: maxAge, logger: logger, base: base, stop: stop}
}

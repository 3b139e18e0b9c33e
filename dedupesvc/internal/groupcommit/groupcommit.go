// Package groupcommit lets the stores write the operations of concurrent
// callers in one transaction and one commit ("group commit"), so that many
// callers share one WAL flush (fsync) instead of queueing for one each.
//
// No caller waits for a batch when the store is idle: a request that finds a
// writer free is written at once, alone. Batches form only from requests that
// arrive while every writer is busy committing; when a writer finishes, it
// takes the waiting requests, up to MaxBatch, as its next batch.
package groupcommit

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Config bounds the batches of a Group.
type Config struct {
	// MaxBatch is the most operations one commit carries. Values below 1
	// count as 1 (every operation its own commit).
	MaxBatch int
	// MaxDelay is how long a batch that formed behind a commit waits for
	// more requests before it is written, unless it is full first. It never
	// delays a request that finds a writer free. 0 writes at once.
	MaxDelay time.Duration
	// Writers is how many batches may be written at once (one for a store
	// with a single writer). Values below 1 count as 1.
	Writers int
}

// Group queues operations of type T and writes them in batches through its
// flush function.
type Group[T any] struct {
	cfg Config
	// flush writes a batch and stores each operation's result in it. Its
	// context ends only when every caller in the batch has given up, so one
	// caller's cancellation never fails the others.
	flush func(ctx context.Context, batch []T)

	mu      sync.Mutex
	queue   []*entry[T]
	writers int
	full    chan struct{} // signalled when the queue reaches MaxBatch

	commits, ops, writing atomic.Int64
}

type entry[T any] struct {
	ctx  context.Context
	op   T
	done chan struct{}
}

// New returns a Group writing batches with flush. flush must set every
// operation's result, also when the batch fails.
func New[T any](cfg Config, flush func(ctx context.Context, batch []T)) *Group[T] {
	cfg.MaxBatch = max(cfg.MaxBatch, 1)
	cfg.Writers = max(cfg.Writers, 1)
	return &Group[T]{cfg: cfg, flush: flush, full: make(chan struct{}, 1)}
}

// Do queues op and returns once it is written (its result set by flush), or
// with ctx's error when ctx ends first; op may then still be written, as a
// statement sent before a cancellation may still commit.
func (g *Group[T]) Do(ctx context.Context, op T) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e := &entry[T]{ctx: ctx, op: op, done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, e)
	if len(g.queue) >= g.cfg.MaxBatch {
		select {
		case g.full <- struct{}{}:
		default:
		}
	}
	if g.writers < g.cfg.Writers {
		g.writers++
		if len(g.queue) == 1 {
			// Nothing waits and a writer is free: write it now, alone, on
			// the caller's goroutine. Whatever queued meanwhile goes to a
			// writer of its own, so this caller returns at once.
			g.queue[0] = nil
			g.queue = g.queue[:0]
			g.mu.Unlock()
			g.write([]*entry[T]{e})
			g.mu.Lock()
			if len(g.queue) > 0 {
				go g.drain(1)
			} else {
				g.writers--
			}
			g.mu.Unlock()
			return nil
		}
		go g.drain(0)
	}
	g.mu.Unlock()
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats returns how many commits the Group made and how many operations they
// carried, for metrics and for tests that must know a batch formed.
func (g *Group[T]) Stats() (commits, ops int64) {
	return g.commits.Load(), g.ops.Load()
}

// Queued returns how many requests wait for a writer, for tests that must
// know a batch will form.
func (g *Group[T]) Queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

// Writing returns how many requests are being written now, for tests that
// must know a writer is busy.
func (g *Group[T]) Writing() int {
	return int(g.writing.Load())
}

// drain is one writer: it writes batches until the queue is empty. Batches
// from round 1 on formed behind a commit, and may linger (MaxDelay).
func (g *Group[T]) drain(round int) {
	for ; ; round++ {
		g.mu.Lock()
		if len(g.queue) == 0 {
			g.writers--
			g.mu.Unlock()
			return
		}
		if round > 0 && g.cfg.MaxDelay > 0 && len(g.queue) < g.cfg.MaxBatch {
			// Requests queued behind the last commit: let more join them.
			g.mu.Unlock()
			g.linger()
			g.mu.Lock()
		}
		var batch []*entry[T]
		for len(g.queue) > 0 && len(batch) < g.cfg.MaxBatch {
			e := g.queue[0]
			g.queue[0] = nil
			g.queue = g.queue[1:]
			if e.ctx.Err() != nil {
				continue // its caller is gone: write nothing for it
			}
			batch = append(batch, e)
		}
		g.mu.Unlock()
		if len(batch) > 0 {
			g.write(batch)
		}
	}
}

// linger waits up to MaxDelay for the queue to fill a batch.
func (g *Group[T]) linger() {
	select {
	case <-g.full: // a stale signal from an earlier batch
	default:
	}
	g.mu.Lock()
	full := len(g.queue) >= g.cfg.MaxBatch
	g.mu.Unlock()
	if full {
		return
	}
	t := time.NewTimer(g.cfg.MaxDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-g.full:
	}
}

// write flushes one batch on a context that ends when every caller of the
// batch has given up, then releases the callers.
func (g *Group[T]) write(batch []*entry[T]) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	defer cancel()
	var live atomic.Int64
	live.Store(int64(len(batch)))
	ops := make([]T, len(batch))
	for i, e := range batch {
		ops[i] = e.op
		stop := context.AfterFunc(e.ctx, func() {
			if live.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	g.writing.Add(int64(len(batch)))
	g.flush(ctx, ops)
	g.writing.Add(-int64(len(batch)))
	g.commits.Add(1)
	g.ops.Add(int64(len(batch)))
	for _, e := range batch {
		close(e.done)
	}
}

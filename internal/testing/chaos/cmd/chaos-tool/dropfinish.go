package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/chaos"
)

// finishDropper is the -drop-first-finish fault: a client interceptor on the
// Dedupe connection that drops the first Finish of each key among every tool
// server sharing dir. The Finish is never sent (the store never sees it) and
// fails UNAVAILABLE, no sooner than after past this process's Begin of the
// key, and only once the suite has acknowledged the drop (chaos.DropClaim),
// so the suite can cut this tool server off from the Dedupe service before
// the gate retries.
type finishDropper struct {
	dir, name string
	pid       int
	after     time.Duration
	ackWait   time.Duration
	logger    *slog.Logger
	mu        sync.Mutex
	begun     map[string]time.Time // key → when this process last sent its Begin
}

func newFinishDropper(dir, name string, after time.Duration, logger *slog.Logger) *finishDropper {
	return &finishDropper{dir: dir, name: name, pid: os.Getpid(), after: after, ackWait: 5 * time.Second, logger: logger, begun: map[string]time.Time{}}
}

func (d *finishDropper) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	switch method {
	case idemgatev1.DedupeService_Begin_FullMethodName:
		if r, ok := req.(*idemgatev1.BeginRequest); ok {
			d.mu.Lock()
			d.begun[r.GetKey()] = time.Now()
			d.mu.Unlock()
		}
	case idemgatev1.DedupeService_Finish_FullMethodName:
		if r, ok := req.(*idemgatev1.FinishRequest); ok && d.claim(r.GetKey()) {
			return d.drop(ctx, r)
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// claim reports whether this is the first Finish of key among the tool
// servers sharing the directory: it publishes the claim file, which fails
// when another Finish of the key published it first.
func (d *finishDropper) claim(key string) bool {
	b, err := json.Marshal(chaos.DropClaim{Server: d.name, Pid: d.pid, Key: key, Time: time.Now()})
	if err != nil {
		return false
	}
	final := filepath.Join(d.dir, url.PathEscape(key))
	tmp, err := os.CreateTemp(d.dir, ".claim-*")
	if err != nil {
		d.logger.Error("drop-first-finish: cannot write a claim", slog.Any("error", err))
		return false
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(b)
	if cerr := tmp.Close(); werr != nil || cerr != nil {
		return false
	}
	// A link is published whole or not at all, and fails if the name exists.
	return os.Link(tmp.Name(), final) == nil
}

// drop fails r's Finish without sending it, once after has passed since the
// key's Begin and the suite acknowledged the claim (at most ackWait).
func (d *finishDropper) drop(ctx context.Context, r *idemgatev1.FinishRequest) error {
	d.mu.Lock()
	begun := d.begun[r.GetKey()]
	d.mu.Unlock()
	if wait := time.Until(begun.Add(d.after)); wait > 0 {
		time.Sleep(wait)
	}
	ack := filepath.Join(d.dir, url.PathEscape(r.GetKey())+chaos.DropAckSuffix)
	deadline := time.Now().Add(d.ackWait)
	for {
		if _, err := os.Stat(ack); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) || ctx.Err() != nil {
			d.logger.Warn("drop-first-finish: the suite did not acknowledge the drop in time", slog.String("key", r.GetKey()))
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	d.logger.Info("drop-first-finish: the first Finish of this key is dropped, never sent",
		slog.String("key", r.GetKey()), slog.Int64("epoch", r.GetEpoch()), slog.Duration("since_begin", time.Since(begun)))
	return status.Error(codes.Unavailable, "chaos-tool: the first Finish of this key was dropped (-drop-first-finish)")
}

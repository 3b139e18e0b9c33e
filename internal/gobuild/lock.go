package gobuild

import (
	"context"
	"os"
	"path/filepath"
	"time"
)

// LockPath is the file whose lock Lock takes: one for the machine, in the
// temporary directory, so that every test process of one go test run
// finds the same one.
var LockPath = filepath.Join(os.TempDir(), "idemgate-gobuild.lock")

// lockPoll is how often a waiting builder tries the lock again.
const lockPoll = 50 * time.Millisecond

// Lock waits until no other builder on this machine holds the build lock,
// takes it, and returns the function that releases it. The go command does
// not share a compile in progress between processes: go test runs test
// processes side by side, and two that each build a tool server compile
// every shared dependency once each (three built at once: 252 CPU-seconds,
// one after another: 122). Serialized, the second build finds the first's
// work in the cache and only links.
//
// Where the lock cannot be taken (no such locks on this system, or the file
// belongs to another user and may not be opened), Lock returns at once and
// the build runs unserialized: the lock saves work, it guards nothing.
func Lock(ctx context.Context) (unlock func(), err error) {
	f, err := os.OpenFile(LockPath, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return func() {}, nil
	}
	for {
		held, err := tryLock(f)
		if err != nil {
			f.Close()
			return func() {}, nil
		}
		if held {
			return func() { f.Close() }, nil // closing the file releases its lock
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(lockPoll):
		}
	}
}

package sqlitestore

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"modernc.org/sqlite"
)

// LockSuffix names the lock file beside the database: dedupe.db.lock. The
// process that has the store open holds an exclusive lock on it and has
// written its pid, host and start time into it. The file stays when the
// store closes: the kernel drops the lock with the process, so a stale file
// never blocks anyone, and removing it would let a second process lock a new
// file while the first still holds the old one.
const LockSuffix = ".lock"

// LockedError is Open's error when another process has the store open. Two
// processes on one embedded store would each believe they alone decide which
// attempt holds a key (each grants leases on its own clock and wakes only
// its own waiters), so the second one is refused.
type LockedError struct {
	// Path is the database file.
	Path string
	// Holder is what the holding process wrote into the lock file, such as
	// "pid 4242 on host tool-1, started 2026-11-30T11:00:00Z"; empty when it
	// has not written it yet or the file could not be read.
	Holder string
}

func (e *LockedError) Error() string {
	holder := e.Holder
	if holder == "" {
		holder = "another process (which has not written its name into " + e.Path + LockSuffix + ")"
	}
	return fmt.Sprintf("sqlitestore: %s is in use by %s: only one process may open the embedded store; "+
		"stop that process first, or give this one its own data directory, or use PostgreSQL to serve from several processes",
		e.Path, holder)
}

// lockFile takes the exclusive lock on path's lock file without waiting and
// writes this process's name into it. Closing the returned file releases the
// lock.
func lockFile(path string) (io.Closer, error) {
	lockPath := path + LockSuffix
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: create lock file: %w", err)
	}
	if err := tryLock(f); err != nil {
		holder := readHolder(f)
		f.Close()
		if errors.Is(err, errLocked) {
			return nil, &LockedError{Path: path, Holder: holder}
		}
		return nil, fmt.Errorf("sqlitestore: lock %s: %w", lockPath, err)
	}
	host, _ := os.Hostname()
	holder := fmt.Sprintf("pid %d on host %s, started %s\n", os.Getpid(), host, time.Now().UTC().Format(time.RFC3339))
	// Truncated only once locked: before, it names the holder to whoever
	// is refused.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(holder), 0)
	}
	return f, nil
}

// errLocked is tryLock's error when another open file holds the lock.
var errLocked = errors.New("locked by another process")

// readHolder returns the first line of the lock file, printable ASCII only
// and bounded, since it goes into an error message.
func readHolder(f *os.File) string {
	buf := make([]byte, 256)
	n, _ := f.ReadAt(buf, 0)
	line, _, _ := strings.Cut(string(buf[:n]), "\n")
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return -1
		}
		return r
	}, line)
}

// SQLite's primary result codes that mean the file or its directory cannot
// be opened or written (modernc.org/sqlite/lib: SQLITE_CANTOPEN,
// SQLITE_READONLY, SQLITE_PERM); an extended code keeps the primary one in
// its low byte.
const (
	sqliteReadOnly = 8
	sqliteCantOpen = 14
	sqlitePerm     = 3
)

// explainOpenError adds to an error opening the store in dir which file it
// was and what to do, for the errors a file system gives: SQLite alone says
// "unable to open database file (14)", naming neither.
func explainOpenError(dir, path string, err error) error {
	var sqliteErr *sqlite.Error
	var lockErr *LockedError
	switch {
	case errors.As(err, &lockErr):
		return err
	case errors.Is(err, syscall.EROFS):
		return fmt.Errorf("sqlitestore: open %s: %w: the file system holding %s is read-only; "+
			"use a data directory on a writable file system", path, err, dir)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("sqlitestore: open %s: %w: a part of %s is a file, not a directory; "+
			"use a data directory path made of directories only", path, err, dir)
	case errors.Is(err, fs.ErrPermission),
		errors.As(err, &sqliteErr) && (sqliteErr.Code()&0xff == sqliteCantOpen || sqliteErr.Code()&0xff == sqliteReadOnly || sqliteErr.Code()&0xff == sqlitePerm):
		return fmt.Errorf("sqlitestore: open %s: %w: this process (uid %d) must be able to write %s and to create files in %s "+
			"(SQLite keeps %s and %s beside it): give the directory to the service's user (chown, chmod 700) or choose another data directory",
			path, err, os.Geteuid(), filepath.Base(path), dir, filepath.Base(path)+"-wal", filepath.Base(path)+"-shm")
	default:
		return err
	}
}

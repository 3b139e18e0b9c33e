package dedupeapp

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/dedupesvc/auth"
)

// readTokenFile reads the token file, refusing one that group or others may
// read or write: it holds every caller's secret.
func readTokenFile(path string) ([]auth.Token, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read -token-file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read -token-file: %w", err)
	}
	if err := privateFile(path, fi); err != nil {
		return nil, err
	}
	tokens, err := auth.ReadTokens(f)
	if err != nil {
		return nil, fmt.Errorf("-token-file %s: %w", path, err)
	}
	return tokens, nil
}

func privateFile(path string, fi fs.FileInfo) error {
	if runtime.GOOS == "windows" { // no Unix permission bits to check
		return nil
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("-token-file %s is open to group or others (mode %#o) and holds every caller's secret: run chmod 600 %s", path, perm, path)
	}
	return nil
}

// fileState is what a change to the token file changes.
type fileState struct {
	mod  time.Time
	size int64
	mode fs.FileMode
}

func statFile(path string) (fileState, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileState{}, err
	}
	return fileState{fi.ModTime(), fi.Size(), fi.Mode()}, nil
}

// watchTokenFile reloads the token file into a on SIGHUP and, every interval
// (when positive), when its modification time, size or mode changed, until
// ctx ends. A file that cannot be used (unreadable, malformed, open to
// others) is logged as an error and the tokens in force stay.
func watchTokenFile(ctx context.Context, path string, interval time.Duration, a *auth.Authenticator, logger *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var tick <-chan time.Time
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	last, _ := statFile(path)
	reload := func(why string) {
		tokens, err := readTokenFile(path)
		if err == nil {
			err = a.SetTokens(tokens)
		}
		if err != nil {
			logger.Error("token file not reloaded; the tokens in force stay: "+err.Error(), slog.String("path", path), slog.String("trigger", why))
			return
		}
		logger.Info("token file reloaded", slog.String("path", path), slog.String("trigger", why), slog.Int("tokens", len(tokens)))
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			last, _ = statFile(path)
			reload("SIGHUP")
		case <-tick:
			now, err := statFile(path)
			if err != nil || now == last {
				if err != nil && last != (fileState{}) {
					logger.Error("token file not readable; the tokens in force stay", slog.String("path", path), slog.Any("error", err))
					last = fileState{}
				}
				continue
			}
			last = now
			reload("changed")
		}
	}
}

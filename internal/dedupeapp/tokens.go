package dedupeapp

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/internal/tokenfile"
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
	if err := privateFile("-token-file", path, "every caller's secret", fi); err != nil {
		return nil, err
	}
	tokens, err := auth.ReadTokens(f)
	if err != nil {
		return nil, fmt.Errorf("-token-file %s: %w", path, err)
	}
	return tokens, nil
}

// privateFile refuses the file at path, given with flag and holding what,
// when group or others may read or write it (tokenfile.CheckPrivate).
var privateFile = tokenfile.CheckPrivate

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
	watchFile(ctx, "token file", path, interval, logger, func() ([]slog.Attr, error) {
		tokens, err := readTokenFile(path)
		if err == nil {
			err = a.SetTokens(tokens)
		}
		return []slog.Attr{slog.Int("tokens", len(tokens))}, err
	})
}

// watchFile calls reload on SIGHUP and, every interval (when positive),
// when the file's modification time, size or mode changed, until ctx ends.
// reload keeps what is in force when it fails; the failure is logged as an
// error, a success at info with the attributes reload returned.
func watchFile(ctx context.Context, what, path string, interval time.Duration, logger *slog.Logger, reload func() ([]slog.Attr, error)) {
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
	load := func(why string) {
		attrs, err := reload()
		if err != nil {
			logger.Error(what+" not reloaded; what is in force stays: "+err.Error(), slog.String("path", path), slog.String("trigger", why))
			return
		}
		args := []any{slog.String("path", path), slog.String("trigger", why)}
		for _, a := range attrs {
			args = append(args, a)
		}
		logger.Info(what+" reloaded", args...)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			last, _ = statFile(path)
			load("SIGHUP")
		case <-tick:
			now, err := statFile(path)
			if err != nil || now == last {
				if err != nil && last != (fileState{}) {
					logger.Error(what+" not readable; what is in force stays", slog.String("path", path), slog.Any("error", err))
					last = fileState{}
				}
				continue
			}
			last = now
			load("changed")
		}
	}
}

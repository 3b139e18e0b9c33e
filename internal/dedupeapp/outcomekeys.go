package dedupeapp

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/idemgate/idemgate/dedupesvc"
)

// readOutcomeKeysFile reads the outcome keys file, refusing one that group
// or others may read or write (it decrypts every stored outcome) and any bad
// line, named by its number.
func readOutcomeKeysFile(path string) ([]dedupesvc.OutcomeKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read -outcome-keys-file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read -outcome-keys-file: %w", err)
	}
	if err := privateFile("-outcome-keys-file", path, "the keys that decrypt every stored outcome", fi); err != nil {
		return nil, err
	}
	keys, err := dedupesvc.ReadOutcomeKeys(f)
	if err != nil {
		return nil, fmt.Errorf("-outcome-keys-file %s: %w", path, err)
	}
	return keys, nil
}

// outcomeCipher loads the outcome keys file into a cipher, or returns nil
// when none is configured.
func outcomeCipher(path string) (*dedupesvc.OutcomeCipher, error) {
	if path == "" {
		return nil, nil
	}
	keys, err := readOutcomeKeysFile(path)
	if err != nil {
		return nil, err
	}
	c, err := dedupesvc.NewOutcomeCipher(keys)
	if err != nil {
		return nil, fmt.Errorf("-outcome-keys-file %s: %w", path, err)
	}
	return c, nil
}

// watchOutcomeKeysFile reloads the outcome keys file into c on SIGHUP until
// ctx ends. It is not polled: with several replicas, a new key must reach
// every one as an opening key (not last) before it becomes the sealing one
// (last), and a signal makes each step deliberate. A file that cannot be
// used is logged as an error and the keys in force stay.
func watchOutcomeKeysFile(ctx context.Context, path string, c *dedupesvc.OutcomeCipher, logger *slog.Logger) {
	watchFile(ctx, "outcome keys file", path, 0, logger, func() ([]slog.Attr, error) {
		keys, err := readOutcomeKeysFile(path)
		if err == nil {
			err = c.SetKeys(keys)
		}
		return []slog.Attr{slog.Int("keys", len(keys)), slog.String("active_key_id", c.ActiveKeyID())}, err
	})
}

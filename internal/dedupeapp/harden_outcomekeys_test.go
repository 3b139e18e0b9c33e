package dedupeapp_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/dedupeapp"
)

func keyLine(id string, b byte) string {
	return id + " " + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)) + "\n"
}

// serveErr runs Serve with cfg on the embedded store and returns its error,
// for a configuration refused at start.
func serveErr(t *testing.T, cfg dedupeapp.Config) error {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	cfg.DataDir = t.TempDir()
	return dedupeapp.Serve(context.Background(), cfg, lis, slog.New(slog.DiscardHandler))
}

// An outcome keys file readable by group or others, or with a bad line, is
// refused at start, naming the file (and the chmod, or the line).
func TestOutcomeKeysFileIsCheckedAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	writeTokens(t, open, keyLine("k1", 1))
	if err := os.Chmod(open, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := serveErr(t, dedupeapp.Config{OutcomeKeysFile: open}); err == nil || !strings.Contains(err.Error(), "-outcome-keys-file "+open) || !strings.Contains(err.Error(), "chmod 600 "+open) {
		t.Fatalf("Serve with a group-readable keys file: %v; want a refusal naming the file and the chmod to run", err)
	}
	for name, text := range map[string]string{
		"short key": keyLine("k1", 1) + "k2 AQEBAQEBAQEBAQEBAQEBAQ==\n",
		"duplicate": keyLine("k1", 1) + keyLine("k1", 2),
		"one field": keyLine("k1", 1) + "k2\n",
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		writeTokens(t, path, text)
		if err := serveErr(t, dedupeapp.Config{OutcomeKeysFile: path}); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("Serve with a keys file with a %s: %v; want a refusal naming the file and line 2", name, err)
		}
	}
}

// With -outcome-keys-file the service seals outcomes and replays them; an
// appended key becomes the active one on SIGHUP and the older outcomes still
// replay.
func TestOutcomeKeysFileSealsAndReloadsOnSIGHUP(t *testing.T) {
	// Not parallel: it signals the test process.
	path := filepath.Join(t.TempDir(), "outcome-keys")
	writeTokens(t, path, keyLine("k1", 1))
	dataDir := t.TempDir()
	addr, logs := startLogged(t, dedupeapp.Config{DataDir: dataDir, OutcomeKeysFile: path, TokenReloadInterval: -1})
	dedupe := idemgatev1.NewDedupeServiceClient(dial(t, addr))
	secret := []byte("ch_3PqR cus_Nf8")
	complete := func(key string) {
		t.Helper()
		begun, err := dedupe.Begin(callCtx(t), beginRequest(key))
		if err != nil || begun.GetReserved() == nil {
			t.Fatalf("Begin %s = %v, %v", key, begun, err)
		}
		if _, err := dedupe.Finish(callCtx(t), &idemgatev1.FinishRequest{Scope: "/x.S/M", Key: key, AttemptToken: "a", Epoch: begun.GetReserved().GetEpoch(),
			Outcome: &anypb.Any{TypeUrl: "type.googleapis.com/x.R", Value: secret}}); err != nil {
			t.Fatalf("Finish %s: %v", key, err)
		}
	}
	replays := func(key string) {
		t.Helper()
		got, err := dedupe.Begin(callCtx(t), beginRequest(key))
		if err != nil || !bytes.Equal(got.GetCompleted().GetOutcome().GetValue(), secret) {
			t.Fatalf("duplicate Begin %s = %v, %v; want the outcome replayed", key, got, err)
		}
	}
	complete("before")
	replays("before")
	writeTokens(t, path, keyLine("k1", 1)+keyLine("k2", 2))
	if err := sighup(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the keys file reloaded with k2 active", func() bool {
		return strings.Contains(logs.String(), "outcome keys file reloaded") && strings.Contains(logs.String(), "active_key_id=k2")
	})
	complete("after")
	replays("after")
	replays("before")
	for _, name := range []string{sqlitestore.FileName, sqlitestore.FileName + "-wal"} {
		if db, err := os.ReadFile(filepath.Join(dataDir, name)); err == nil && bytes.Contains(db, secret) {
			t.Fatalf("the embedded store's %s holds the outcome in plaintext", name)
		}
	}
}

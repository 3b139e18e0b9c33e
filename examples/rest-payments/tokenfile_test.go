package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// demoTokens returns a copy of the demo's tokens.txt that only its owner
// may read, as the server requires (git checks the file out 0644).
func demoTokens(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("tokens.txt")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tokens.txt")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startBound is the context a start that must fail runs in: a server that
// starts instead is killed after a minute (the failure then reads "signal:
// killed"), rather than holding the test to its timeout.
func startBound(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// A -caller-token-file that group or others may read is refused at start,
// naming the file, its mode and the fix, as dedupesvc refuses its
// -token-file (issue 40 item 5: the server served with a 0644 file).
func TestTokenFileOpenToOthersIsRefused(t *testing.T) {
	t.Parallel()
	if runtime.GOOS == "windows" {
		t.Skip("no Unix permission bits")
	}
	bin := proctest.Build(t, ".")
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o660} {
		tokens := demoTokens(t)
		if err := os.Chmod(tokens, mode); err != nil {
			t.Fatal(err)
		}
		out, err := exec.CommandContext(startBound(t), bin, "-listen", stacktest.FreeAddr(t), "-data-dir", t.TempDir(), "-caller-token-file", tokens).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("mode %#o: %v, want exit status 1\n%s", mode, err, out)
		}
		want := fmt.Sprintf("-caller-token-file %s is open to group or others (mode %#o)", tokens, mode)
		if !strings.Contains(string(out), want) || !strings.Contains(string(out), "chmod 600 "+tokens) {
			t.Errorf("mode %#o: output\n%s\nwant %q and the chmod that fixes it", mode, out, want)
		}
	}
}

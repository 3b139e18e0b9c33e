package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

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
		proctest.WantRefusedAtStart(t, bin, []string{"-listen", stacktest.FreeAddr(t), "-data-dir", t.TempDir(), "-caller-token-file", tokens},
			fmt.Sprintf("-caller-token-file %s is open to group or others (mode %#o)", tokens, mode), "chmod 600 "+tokens)
	}
}

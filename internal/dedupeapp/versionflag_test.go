package dedupeapp_test

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/version"
)

// dedupesvc -version is asked for before the environment is read or any
// flag checked; a command embedding the service (payments-server -dedupe
// in-process -- ...) refuses it after its "--", where it is not its own.
func TestVersionFlag(t *testing.T) {
	bad := cliflag.Map(map[string]string{"IDEMGATE_SWEEP_INTERVAL": "soon"})
	for _, args := range [][]string{{"-version"}, {"migrate", "-version"}, {"-listen", "", "-version"}} {
		if _, _, err := dedupeapp.ParseArgs("dedupesvc", "", args, bad, io.Discard); !errors.Is(err, version.ErrRequested) {
			t.Errorf("ParseArgs(%q) = %v, want version.ErrRequested", args, err)
		}
	}
	_, err := dedupeapp.ParseConfig("payments-server -dedupe in-process --", []string{"-version"}, cliflag.Map(nil), io.Discard)
	if err == nil || errors.Is(err, version.ErrRequested) || !strings.Contains(err.Error(), "-version") {
		t.Errorf("ParseConfig(-version) = %v, want an error saying where -version goes", err)
	}
}

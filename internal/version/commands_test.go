package version_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/idemgate/idemgate/internal/gobuild"
	"github.com/idemgate/idemgate/internal/testing/proctest"
)

// line is -version's output: the name, the version ("(devel)" for a local
// build, else a module version), then the commit when the build knows it.
func line(name string) *regexp.Regexp {
	return regexp.MustCompile(`^` + regexp.QuoteMeta(name) + ` (\(devel\)|v[0-9]\S*)( \(commit [0-9a-f]{7}(, [0-9TZ:-]+)?(, modified)?\))?\n$`)
}

// Every command prints one version line on -version and exits 0, whatever
// its other flags, their variables or its required flags say.
func TestEveryCommandPrintsItsVersion(t *testing.T) {
	t.Parallel()
	// Variables each command's own parse would refuse: -version must not read them.
	env := []string{"IDEMGATE_SWEEP_INTERVAL=soon", "PAYMENTS_REFLECTION=maybe", "IDEMGATE_MCP_CALL_TIMEOUT=soon", "IDEMCTL_INSECURE_PLAINTEXT=maybe"}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"dedupesvc", []string{"-version"}},
		{"dedupesvc", []string{"migrate", "-version"}},
		{"idemctl", []string{"-version"}},
		{"idemgate-mcp", []string{"-version"}}, // without the required -target
		{"incident-replay", []string{"-version"}},
		{"payments-server", []string{"-version"}},
		{"paymentsctl", []string{"-version"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			bin := proctest.Build(t, "github.com/idemgate/idemgate/cmd/"+c.name)
			cmd := exec.Command(bin, c.args...)
			cmd.Env = append(cmd.Environ(), env...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil || !line(c.name).MatchString(stdout.String()) || stderr.Len() > 0 {
				t.Errorf("%s %q: %v\nstdout %q\nstderr %q\nwant exit 0 and one line %s", c.name, c.args, err, stdout.String(), stderr.String(), line(c.name))
			}
		})
	}
}

// What the Makefile stamps with -ldflags -X shows when the build recorded
// no VCS information (GOFLAGS=-buildvcs=false).
func TestStampedVersion(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "paymentsctl")
	const pkg = "github.com/idemgate/idemgate/internal/version"
	ldflags := "-X " + pkg + ".version=v0.3.0 -X " + pkg + ".revision=4e37491c0ffee0ddba11ab1ec0ffee0ddba11ab1 -X " +
		pkg + ".commitTime=2026-12-02T02:50:15Z -X " + pkg + ".modified=true"
	if err := gobuild.Build(context.Background(), "", ldflags, "-buildvcs=false", "-o", bin, "github.com/idemgate/idemgate/cmd/paymentsctl"); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-version").Output()
	if want := "paymentsctl v0.3.0 (commit 4e37491, 2026-12-02T02:50:15Z, modified)\n"; err != nil || string(out) != want {
		t.Errorf("-version: %q, %v; want %q", out, err, want)
	}
}

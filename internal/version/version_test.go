package version

import (
	"flag"
	"io"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	const rev = "4e37491c0ffee0ddba11ab1ec0ffee0ddba11ab1"
	vcs := []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev},
		{Key: "vcs.time", Value: "2026-12-02T02:50:15Z"}, {Key: "vcs.modified", Value: "true"}}
	stamped := Info{Version: "v0.2.0-stamped", Revision: "b0b0b0b0b0b0", Time: "2026-01-01T00:00:00Z"}
	for _, c := range []struct {
		name    string
		bi      *debug.BuildInfo
		stamped Info
		want    string
	}{
		{"go install module@version, with VCS", &debug.BuildInfo{Main: debug.Module{Version: "v0.3.0"}, Settings: vcs}, Info{}, "v0.3.0 (commit 4e37491, 2026-12-02T02:50:15Z, modified)"},
		{"local build with VCS", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs[:3]}, Info{}, "(devel) (commit 4e37491, 2026-12-02T02:50:15Z)"},
		{"local build, no VCS, nothing stamped", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, Info{}, "(devel)"},
		{"no build information", nil, Info{}, "(devel)"},
		{"no VCS, stamped by the Makefile", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, stamped, "v0.2.0-stamped (commit b0b0b0b, 2026-01-01T00:00:00Z)"},
		{"the build information wins over the stamp", &debug.BuildInfo{Main: debug.Module{Version: "v0.3.0"}, Settings: vcs}, stamped, "v0.3.0 (commit 4e37491, 2026-12-02T02:50:15Z, modified)"},
		{"a stamped commit without a version", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, Info{Revision: rev, Modified: true}, "(devel) (commit 4e37491, modified)"},
	} {
		if got := fromBuildInfo(c.bi, c.stamped).String(); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

func TestStringStartsWithTheName(t *testing.T) {
	if got := String("dedupesvc"); !strings.HasPrefix(got, "dedupesvc ") || strings.Contains(got, "\n") {
		t.Errorf("String(dedupesvc) = %q, want one line starting with the name", got)
	}
}

func TestFlag(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	v := Flag(fs)
	if err := fs.Parse([]string{"-version"}); err != nil || !*v {
		t.Errorf("-version: %v, %v; want it set", *v, err)
	}
}

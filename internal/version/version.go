// Package version tells which build of an idemgate command is running: the
// module version and the commit it was built from, read from the binary's
// build information (runtime/debug.ReadBuildInfo), or from what the
// Makefile stamps with -ldflags -X when go build recorded no VCS
// information (GOFLAGS=-buildvcs=false, a git worktree, a source tarball).
//
// Every command has a -version flag (Flag) that prints String's one line
// and exits 0, and the long-running servers log it at start-up (Attr).
package version

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"
)

// Stamped by the Makefile with -ldflags -X, for builds whose build
// information has no VCS settings; each is used only where the build
// information has nothing better. Empty by default.
var (
	// version is the module version, e.g. v0.3.0 (-X .../internal/version.version=v0.3.0).
	version string
	// revision is the full commit hash.
	revision string
	// commitTime is the commit's time, RFC 3339 in UTC.
	commitTime string
	// modified is "true" when the work tree had uncommitted changes.
	modified string
)

// Info is what a binary knows about its own build.
type Info struct {
	// Version is the main module's version: a tag such as v0.3.0 for go
	// install module@version, a pseudo-version, or "(devel)" for a local
	// build that no version was stamped into.
	Version string
	// Revision is the commit hash, empty when unknown.
	Revision string
	// Time is the commit's time as recorded (RFC 3339), empty when unknown.
	Time string
	// Modified reports uncommitted changes in the work tree at build time.
	Modified bool
}

// Read returns the running binary's Info: runtime/debug.ReadBuildInfo's,
// with the Makefile's stamped values filling what it lacks.
func Read() Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuildInfo(bi, Info{Version: version, Revision: revision, Time: commitTime, Modified: modified == "true"})
}

// fromBuildInfo is Read on given build information (nil when there is
// none) and stamped values.
func fromBuildInfo(bi *debug.BuildInfo, stamped Info) Info {
	info := Info{Version: "(devel)"}
	vcs := false
	if bi != nil {
		if v := bi.Main.Version; v != "" {
			info.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision, vcs = s.Value, true
			case "vcs.time":
				info.Time = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if stamped.Version != "" && info.Version == "(devel)" {
		info.Version = stamped.Version
	}
	if !vcs && stamped.Revision != "" {
		info.Revision, info.Time, info.Modified = stamped.Revision, stamped.Time, stamped.Modified
	}
	return info
}

// String returns the one line -version prints for the command name:
// "dedupesvc v0.3.0 (commit 4e37491, 2026-12-02T02:50:15Z, modified)",
// "dedupesvc (devel)" when the build recorded no commit.
func (i Info) String() string {
	return i.Version + i.details()
}

// details is " (commit 4e37491, time, modified)", or "" without a commit.
func (i Info) details() string {
	if i.Revision == "" {
		return ""
	}
	parts := []string{"commit " + short(i.Revision)}
	if i.Time != "" {
		parts = append(parts, i.Time)
	}
	if i.Modified {
		parts = append(parts, "modified")
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// short is a commit hash's first 7 characters, as git abbreviates it.
func short(rev string) string {
	if len(rev) > 7 {
		return rev[:7]
	}
	return rev
}

// String returns the running binary's version line for the command name:
// name followed by Read's Info.
func String(name string) string {
	return name + " " + Read().String()
}

// Attr is the version as a log attribute, version="v0.3.0 (commit ...)",
// for a server's start-up line.
func Attr() slog.Attr {
	return slog.String("version", Read().String())
}

// Flag defines -version on fs and returns whether it was given. Define it
// after cliflag.Bind, so that it reads no environment variable: a variable
// must not turn a server into a command that prints and exits. Check it
// right after parsing, before any other check, and call Print when set.
func Flag(fs *flag.FlagSet) *bool {
	return fs.Bool("version", false, "print the version and the commit built from, and exit")
}

// ErrRequested is what a command's parse function returns when the command
// line gave -version, as flag.ErrHelp is for -h: the caller prints the
// version (Print) and exits 0, and checks nothing else.
var ErrRequested = errors.New("-version given: print the version and exit")

// Print writes String(name) and a newline to w.
func Print(w io.Writer, name string) {
	fmt.Fprintln(w, String(name))
}

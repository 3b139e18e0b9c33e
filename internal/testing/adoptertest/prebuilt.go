package adoptertest

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"

	"github.com/idemgate/idemgate/internal/gobuild"
)

// goInstallLine is how the guide installs a tool: into its own bin/, at a
// version (docs/adopting.md step 2).
var goInstallLine = regexp.MustCompile(`(?m)^GOBIN=\$PWD/bin go install (\S+)@(\S+)$`)

// toolsDir is where make tools keeps the pinned tools: TOOLS_DIR as the
// Makefile exports it, else the Makefile's default.
func toolsDir() string {
	if d := os.Getenv("TOOLS_DIR"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".cache", "idemgate", "tools")
}

// prebuilt returns the binary make tools built for pkg at version in dir,
// when it is exactly what the guide's go install line would build here:
// the same package and module version, the same toolchain, and
// internal/gobuild's flags (the Makefile's rule is that line with another
// GOBIN: TestMakefileToolsUseTheSharedSet, TestGuidePinsAreTheMakefiles).
// Otherwise it returns "" and why. On an empty build cache buf alone
// compiles 559 packages that nothing else in make test does; a machine
// that ran make tools (or make lint) has compiled them once already.
func prebuilt(dir, pkg, version string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("no tools directory")
	}
	name := path.Base(pkg)
	bin := filepath.Join(dir, name+"-"+version, name)
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return "", err
	}
	switch {
	case info.Path != pkg:
		return "", fmt.Errorf("%s is %s, not %s", bin, info.Path, pkg)
	case info.Main.Version != version:
		return "", fmt.Errorf("%s is %s@%s, not @%s", bin, info.Main.Path, info.Main.Version, version)
	case info.GoVersion != runtime.Version():
		return "", fmt.Errorf("%s was built by %s, this toolchain is %s", bin, info.GoVersion, runtime.Version())
	}
	if err := gobuild.Check(bin); err != nil {
		return "", fmt.Errorf("%s: %w", bin, err)
	}
	return bin, nil
}

package gobuild

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Flags are the go build flags every non-race binary is built with:
// -trimpath, so that a binary holds no path of this machine and the image is
// reproducible.
var Flags = []string{"-trimpath"}

// Env is the environment every non-race binary is built with, added to the
// builder's own: CGO_ENABLED=0, so that the binary is static (the image has
// no C library; modernc.org/sqlite is pure Go) and the build does not depend
// on a C compiler being installed.
var Env = []string{"CGO_ENABLED=0"}

// Command returns go build with Flags and Env, ldflags (none when empty)
// and args (-o, packages), run in dir (the current directory when empty).
// go test puts its own go first on PATH, so in a test this is the toolchain
// that built the test. A caller that runs it takes Lock first, as Build does.
func Command(ctx context.Context, dir, ldflags string, args ...string) *exec.Cmd {
	argv := append([]string{"build"}, Flags...)
	if ldflags != "" {
		argv = append(argv, "-ldflags="+ldflags)
	}
	cmd := exec.CommandContext(ctx, "go", append(argv, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), Env...)
	return cmd
}

// Build runs Command while it holds Lock and returns its combined output in
// the error when it fails.
func Build(ctx context.Context, dir, ldflags string, args ...string) error {
	unlock, err := Lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	cmd := Command(ctx, dir, ldflags, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return nil
}

// Check reports whether the binary at path was built with Flags and Env, as
// its build information records them (go version -m): an error names the
// first setting that differs.
func Check(path string) error {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return err
	}
	got := map[string]string{}
	for _, s := range info.Settings {
		got[s.Key] = s.Value
	}
	want := map[string]string{"-trimpath": "true", "CGO_ENABLED": "0", "-race": ""}
	for _, kv := range Env {
		k, v, _ := strings.Cut(kv, "=")
		want[k] = v
	}
	for _, f := range Flags {
		want[f] = "true"
	}
	for _, k := range []string{"-race", "-trimpath", "CGO_ENABLED", "-tags", "-gcflags", "-asmflags", "-buildmode", "-compiler"} {
		w, ok := want[k]
		if !ok {
			// Not part of the shared set: the go command's default, which
			// it records as no setting (or as gc and exe).
			w = map[string]string{"-compiler": "gc", "-buildmode": "exe"}[k]
		}
		if got[k] != w {
			return fmt.Errorf("%s was built with %s=%q, want %q (internal/gobuild's Flags and Env)", path, k, got[k], w)
		}
	}
	return nil
}

// Environ returns env with Env added and Flags appended to GOFLAGS (to the
// go command's own GOFLAGS, go env -w included), for a script whose go build
// and go install lines are written as a person types them: run with it, they
// build with the shared set too.
func Environ(env []string) ([]string, error) {
	out, err := exec.Command("go", "env", "GOFLAGS").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOFLAGS: %w", err)
	}
	goflags := strings.Join(append(strings.Fields(string(out)), Flags...), " ")
	return append(append(env, Env...), "GOFLAGS="+goflags), nil
}

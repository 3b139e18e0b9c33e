package gobuild

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A binary Command builds passes Check; one the go command's defaults build
// (cgo on, full paths) fails it, naming the setting.
func TestCheckTellsTheSharedSetFromDefaults(t *testing.T) {
	dir := t.TempDir()
	shared, plain := filepath.Join(dir, "shared"), filepath.Join(dir, "plain")
	if err := Build(context.Background(), "", "-s -w", "-o", shared, "./testdata/hello"); err != nil {
		t.Fatal(err)
	}
	if err := Check(shared); err != nil {
		t.Errorf("built by Command: %v", err)
	}
	cmd := exec.Command("go", "build", "-o", plain, "./testdata/hello")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := Check(plain); err == nil || !strings.Contains(err.Error(), "-trimpath") {
		t.Errorf("built with the defaults: Check = %v, want an error naming -trimpath", err)
	}
}

// goBuilder is a go command that builds or installs, written as a Go string
// literal list ("go", "build" or "go", "install").
var goBuilder = regexp.MustCompile(`"go",\s*(?:append\(\[\]string\{)?"(?:build|install|run)"`)

// Every Go file of the repository that builds a binary does it through this
// package: a builder calling go build itself would compile every dependency
// once more with its own flags (issue 32). internal/testing/readmetest holds
// the guides' builds to Env.
func TestEveryBuilderUsesThisPackage(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	self, _ := filepath.Abs(".")
	var files int
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "gen", "node_modules", "bin", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || filepath.Dir(p) == self {
			return nil
		}
		files++
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range goBuilder.FindAllIndex(b, -1) {
			line := 1 + strings.Count(string(b[:m[0]]), "\n")
			rel, _ := filepath.Rel(root, p)
			t.Errorf("%s:%d runs %s itself: build through internal/gobuild (Command or Build), whose flags every builder shares", rel, line, b[m[0]:m[1]])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("scanned %d Go files: the walk is broken", files)
	}
	// The pattern finds what it is for.
	for _, src := range []string{`exec.Command("go", "build", "-o", bin, pkg)`, `exec.CommandContext(ctx, "go", "install", x)`, `exec.Command("go", append([]string{"build"}, flags...)...)`} {
		if !goBuilder.MatchString(src) {
			t.Errorf("goBuilder misses %s", src)
		}
	}
}

// The Makefile's tools (make tools, which CI runs before make test) build
// with the shared set through GO_INSTALL: the adopter's guide's test installs
// buf and the plugins with it too and then compiles none of them again.
func TestMakefileToolsUseTheSharedSet(t *testing.T) {
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	mk := string(b)
	def := regexp.MustCompile(`(?m)^GO_INSTALL\s*:=\s*(.*)$`).FindStringSubmatch(mk)
	if def == nil {
		t.Fatal("the Makefile defines no GO_INSTALL")
	}
	want := strings.Join(Env, " ") + " go install " + strings.Join(Flags, " ")
	if strings.TrimSpace(def[1]) != want {
		t.Errorf("GO_INSTALL is %q, want %q (internal/gobuild's Env and Flags)", def[1], want)
	}
	installs := regexp.MustCompile(`(?m)^\t.*\bgo (?:install|build)\b.*$`).FindAllString(mk, -1)
	var tools int
	for _, line := range installs {
		if strings.Contains(line, "go install") {
			t.Errorf("Makefile recipe %q runs go install itself: use $(GO_INSTALL)", strings.TrimSpace(line))
		}
	}
	tools = strings.Count(mk, "$(GO_INSTALL) ")
	if tools < 6 {
		t.Errorf("%d tools built with $(GO_INSTALL), want buf, the three plugins, staticcheck, benchstat and ghz", tools)
	}
}

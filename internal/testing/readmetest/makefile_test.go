package readmetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// makeVar is the value of a simple NAME := value line of the Makefile.
func makeVar(t *testing.T, makefile, name string) []string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + `\s*:=\s*(.*)$`).FindStringSubmatch(makefile)
	if m == nil {
		t.Fatalf("Makefile: no %s :=", name)
	}
	return strings.Fields(m[1])
}

// recipes maps each rule target of the Makefile to its recipe lines.
func recipes(makefile string) map[string][]string {
	out := map[string][]string{}
	target := ""
	for _, line := range strings.Split(makefile, "\n") {
		switch {
		case strings.HasPrefix(line, "\t") && target != "":
			out[target] = append(out[target], strings.TrimSpace(line))
		case line == "" || strings.HasPrefix(line, "#"):
		default:
			target = ""
			if i := strings.Index(line, ":"); i > 0 && !strings.ContainsAny(line[:i], "=?+ ") && !strings.HasPrefix(line[i:], ":=") {
				target = line[:i]
			}
		}
	}
	return out
}

// modules lists the modules the packages pkgs build from (go list -deps).
func modules(t *testing.T, root string, pkgs ...string) map[string]bool {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}"}, pkgs...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %v: %v", pkgs, err)
	}
	set := map[string]bool{}
	for _, m := range strings.Fields(string(out)) {
		set[m] = true
	}
	return set
}

// Every make run-* target runs what make build built, or go-runs a package
// whose modules make build already fetched: after make build, none needs a
// module it has not (issue 32: make run-mcp-server needed one).
func TestRunTargetsNeedNothingMakeBuildDidNotFetch(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	makefile := string(b)
	var built, builtPkgs []string
	for _, c := range makeVar(t, makefile, "CMDS") {
		built, builtPkgs = append(built, c), append(builtPkgs, "./cmd/"+c)
	}
	if strings.Contains(makefile, "EXAMPLE_CMDS :=") {
		for _, c := range makeVar(t, makefile, "EXAMPLE_CMDS") {
			built, builtPkgs = append(built, c), append(builtPkgs, "./examples/"+c)
		}
	}
	fetched := modules(t, root, builtPkgs...)
	binRef := regexp.MustCompile(`\$\(BIN_DIR\)/([\w.-]+)`)
	goRun := regexp.MustCompile(`go run (\./\S+)`)
	runs := 0
	for target, lines := range recipes(makefile) {
		if !strings.HasPrefix(target, "run") {
			continue
		}
		runs++
		for _, line := range lines {
			for _, m := range binRef.FindAllStringSubmatch(line, -1) {
				if !slices.Contains(built, m[1]) && !strings.Contains(m[1], ".") {
					t.Errorf("make %s runs $(BIN_DIR)/%s, which make build does not build", target, m[1])
				}
			}
			for _, m := range goRun.FindAllStringSubmatch(line, -1) {
				for mod := range modules(t, root, m[1]) {
					if !fetched[mod] {
						t.Errorf("make %s: go run %s needs the module %s, which make build does not fetch", target, m[1], mod)
					}
				}
			}
		}
	}
	if runs < 4 {
		t.Fatalf("found %d run targets in the Makefile: the parsing is broken", runs)
	}
}

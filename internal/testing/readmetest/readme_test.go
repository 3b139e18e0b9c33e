// Package readmetest checks that the Go snippets of the README and docs/ are code that
// compiles: each one is kept, verbatim, in snippets_test.go, which the
// compiler checks, and this test fails when a README snippet is not one of
// them or one of them is no longer in the README.
//
// A ```go block on the line after <!-- file: PATH --> is a whole file of a
// guide that a test writes and builds (docs/adopting.md, which
// internal/testing/adoptertest runs), not a snippet: it is not looked for
// in snippets_test.go.
package readmetest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fileBlock is the annotation that marks a block as a guide's whole file.
var fileBlock = regexp.MustCompile(`^<!--\s*file:.*-->$`)

// builtGuide is the one doc in docs/ whose file blocks a test builds.
const builtGuide = "adopting.md"

// readmeBlocks returns the ```go blocks of the README and of docs/*.md,
// except those marked as a guide's files.
func readmeBlocks(t *testing.T) []string {
	t.Helper()
	root := filepath.Join("..", "..", "..")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, path := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, m := range regexp.MustCompile("(?ms)^```go\\n(.*?)^```").FindAllStringSubmatchIndex(text, -1) {
			before := strings.TrimSuffix(text[:m[0]], "\n")
			if fileBlock.MatchString(strings.TrimSpace(before[strings.LastIndex(before, "\n")+1:])) {
				if filepath.Base(path) != builtGuide {
					t.Errorf("%s: a ```go block marked <!-- file: ... --> is skipped here, but only docs/%s's are built (by internal/testing/adoptertest): make it a snippet", path, builtGuide)
				}
				continue
			}
			blocks = append(blocks, strings.TrimRight(text[m[2]:m[3]], "\n"))
		}
	}
	return blocks
}

// compiledSnippets returns the regions of snippets_test.go between
// README:begin and README:end, each without the indentation of its begin
// line.
func compiledSnippets(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("snippets_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var snippets []string
	var cur []string
	indent, in := "", false
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "// README:begin":
			indent, in, cur = line[:len(line)-len(strings.TrimLeft(line, "\t"))], true, nil
		case trimmed == "// README:end":
			snippets = append(snippets, strings.Join(cur, "\n"))
			in = false
		case in:
			cur = append(cur, strings.TrimPrefix(line, indent))
		}
	}
	if in {
		t.Fatal("snippets_test.go: a README:begin without its README:end")
	}
	return snippets
}

func TestREADMESnippetsCompile(t *testing.T) {
	if len(snippets) == 0 {
		t.Fatal("no snippet functions")
	}
	blocks, compiledTexts := readmeBlocks(t), compiledSnippets(t)
	if len(blocks) == 0 || len(compiledTexts) == 0 {
		t.Fatalf("%d README blocks, %d compiled snippets: the extraction is broken", len(blocks), len(compiledTexts))
	}
	compiled := map[string]bool{}
	for _, s := range compiledTexts {
		compiled[s] = true
	}
	shown := map[string]bool{}
	for i, b := range blocks {
		shown[b] = true
		if !compiled[b] {
			t.Errorf("README or docs ```go block %d is not in snippets_test.go, so nothing compiles it: copy it there, between README:begin and README:end, and make it compile:\n%s", i+1, b)
		}
	}
	for _, s := range compiledTexts {
		if !shown[s] {
			t.Errorf("snippets_test.go holds a snippet the README does not show (update the README's block, or remove it):\n%s", s)
		}
	}
}

package readmetest

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// quoted is a quoted phrase of prose, which may wrap onto the next line.
var quoted = regexp.MustCompile(`"([^"\n]+(?:\n[^"\n]+)?)"`)

// fileMarker is the adopter's-guide marker naming the file a block is saved
// as: an HTML comment, which GitHub does not render.
var fileMarker = regexp.MustCompile(`(?m)^<!-- file: (\S+) -->$`)

// checkNames returns what a reader of the rendered files cannot follow: a
// section named by quoting its title instead of linked (titles move between
// files, and a quoted one then points nowhere while the link check passes),
// and a block to save whose file name only an HTML comment gives.
func checkNames(files map[string]string) []string {
	titles := map[string]bool{}
	for _, text := range files {
		for _, m := range heading.FindAllStringSubmatch(split(text).prose, -1) {
			titles[normalSpace(m[1])] = true
		}
	}
	var problems []string
	for name, text := range files {
		prose := codeSpan.ReplaceAllString(split(text).prose, "``")
		for _, m := range quoted.FindAllStringSubmatch(prose, -1) {
			if title := normalSpace(m[1]); titles[title] {
				problems = append(problems, fmt.Sprintf("%s: names the section %q by its title: link it instead", name, title))
			}
		}
		for _, loc := range fileMarker.FindAllStringSubmatchIndex(text, -1) {
			file := text[loc[2]:loc[3]]
			before := strings.TrimRight(text[:loc[0]], "\n")
			paragraph := before[strings.LastIndex(before, "\n\n")+1:]
			if !strings.Contains(paragraph, "`"+file+"`") {
				problems = append(problems, fmt.Sprintf("%s: the block saved as %s is not named in the text before it (the file: comment does not render)", name, file))
			}
		}
	}
	sort.Strings(problems)
	return problems
}

func normalSpace(s string) string { return strings.Join(strings.Fields(s), " ") }

// README.md and docs/*.md link the sections they refer to and name, in
// rendered text, every file the reader is asked to save.
func TestDocsLinkSectionsAndNameFiles(t *testing.T) {
	for _, p := range checkNames(docFiles(t)) {
		t.Error(p)
	}
}

// The check finds a quoted title across a line break and an unnamed file
// block, and leaves linked sections, other quotes and named files alone.
func TestCheckNamesFindsQuotedTitlesAndUnnamedFiles(t *testing.T) {
	files := map[string]string{
		"README.md": "# idemgate\n## Choosing a store\n## How long the first build takes\n",
		"docs/guide.md": strings.Join([]string{
			"# Guide",
			`See the README's "How long the first`,
			`build takes", and [Choosing a store](../README.md#choosing-a-store); "use a new key".`,
			"`\"Choosing a store\"` in code is fine.",
			"",
			"Save this as `buf.yaml`:",
			"",
			"<!-- file: buf.yaml -->",
			"",
			"One more file:",
			"",
			"<!-- file: main.go -->",
		}, "\n"),
	}
	got := checkNames(files)
	want := []string{
		`docs/guide.md: names the section "How long the first build takes" by its title: link it instead`,
		`docs/guide.md: the block saved as main.go is not named in the text before it (the file: comment does not render)`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("checkNames found\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

package readmetest

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is the repository's root, from this package's directory.
var repoRoot = filepath.Join("..", "..", "..")

// docFiles returns README.md and docs/*.md, relative to the repository
// root, with their texts.
func docFiles(t *testing.T) map[string]string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, p := range append([]string{filepath.Join(repoRoot, "README.md")}, docs...) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(repoRoot, p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.ToSlash(rel)] = string(b)
	}
	return files
}

// markdown is one file split the way the checks need it: the prose outside
// fenced code blocks (each fenced line blanked, so line numbers hold), and
// the fenced blocks' lines.
type markdown struct {
	prose  string
	fenced []string
}

// fence opens or closes a fenced code block, also one indented in a list.
var fence = regexp.MustCompile("^\\s*(```|~~~)")

func split(text string) markdown {
	var md markdown
	var prose []string
	open := ""
	for _, line := range strings.Split(text, "\n") {
		if m := fence.FindStringSubmatch(line); m != nil && (open == "" || m[1] == open) {
			if open == "" {
				open = m[1]
			} else {
				open = ""
			}
			prose = append(prose, "")
			continue
		}
		if open != "" {
			md.fenced = append(md.fenced, line)
			prose = append(prose, "")
			continue
		}
		prose = append(prose, line)
	}
	md.prose = strings.Join(prose, "\n")
	return md
}

var (
	// codeSpan is an inline code span, which may wrap across lines.
	codeSpan = regexp.MustCompile("(?s)``[^`].*?``|`[^`]*`")
	// heading is an ATX heading.
	heading = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$`)
	// inlineLink is [text](target) or ![alt](target), with an optional title.
	inlineLink = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// refDefinition is a reference-style link's definition.
	refDefinition = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	// htmlAnchor is an explicit anchor: <a id="..."> or <a name="...">.
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	// external is a link with a scheme (https:, mailto:): not checked here.
	external = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
)

// slug is the anchor GitHub gives a heading: lower case, every character
// but letters, digits, marks, '_', '-' and spaces dropped, and each space a
// '-'. Inline code keeps its text, a link its text, emphasis is dropped.
func slug(title string) string {
	title = inlineLink.ReplaceAllString(title, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.Is(unicode.Mn, r) || unicode.Is(unicode.Mc, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors a file's headings and explicit anchors
// define, with GitHub's -1, -2, ... for repeated headings.
func anchors(md markdown) map[string]bool {
	got := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(md.prose, -1) {
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			got[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			got[s] = true
		}
		seen[s]++
	}
	for _, m := range htmlAnchor.FindAllStringSubmatch(md.prose, -1) {
		got[m[1]] = true
	}
	return got
}

// links returns the link targets of a file's prose, code spans left out.
func links(md markdown) []string {
	prose := codeSpan.ReplaceAllString(md.prose, "``")
	var targets []string
	for _, m := range inlineLink.FindAllStringSubmatch(prose, -1) {
		targets = append(targets, m[2])
	}
	for _, m := range refDefinition.FindAllStringSubmatch(prose, -1) {
		targets = append(targets, m[1])
	}
	return targets
}

// makeWord is a word that may name a make target.
var makeWord = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// makeTargets returns the targets of every `make ...` command a file shows,
// in its code spans and fenced blocks (prose says "make" for other things):
// the words after make up to the end of the command, leaving out variable
// assignments and flags.
func makeTargets(md markdown) []string {
	code := md.fenced
	for _, s := range codeSpan.FindAllString(md.prose, -1) {
		code = append(code, strings.Trim(s, "`"))
	}
	var targets []string
	for _, c := range code {
		fields := strings.Fields(c)
		for i := 0; i < len(fields); i++ {
			if fields[i] != "make" || (i > 0 && !shellSeparator(fields[i-1])) {
				continue
			}
			for _, w := range fields[i+1:] {
				if strings.Contains(w, "=") || strings.HasPrefix(w, "-") {
					continue
				}
				if !makeWord.MatchString(w) {
					break
				}
				targets = append(targets, w)
			}
		}
	}
	return targets
}

// shellSeparator reports whether a word ends the command before it, so that
// the word after it starts a new one ("$ make run", "... && make test").
func shellSeparator(w string) bool {
	switch w {
	case "$", "&&", "||", ";", "|", "(", "then", "do":
		return true
	}
	return strings.HasSuffix(w, ";")
}

// makefileTargets returns the targets a Makefile defines: rule targets and
// .PHONY names, generated names ($(...), patterns) left out.
func makefileTargets(makefile string) map[string]bool {
	targets := map[string]bool{}
	for _, line := range strings.Split(makefile, "\n") {
		if strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.Index(line, ":")
		if i < 0 || strings.ContainsAny(line[:i], "=?+") || strings.HasPrefix(line[i:], ":=") || strings.HasPrefix(line[i:], "::=") {
			continue
		}
		names := line[:i]
		if strings.HasPrefix(names, ".PHONY") {
			names = line[i+1:]
		}
		for _, n := range strings.Fields(strings.TrimSuffix(names, "&")) {
			if !strings.ContainsAny(n, "$%") && !strings.HasPrefix(n, ".") {
				targets[n] = true
			}
		}
	}
	return targets
}

// checkDocs returns what is broken in files (path relative to the root:
// text): relative links to files that do not exist, #anchors no heading of
// their file defines, and make targets the Makefile lacks. exists reports
// whether a path relative to the root exists.
func checkDocs(files map[string]string, exists func(string) bool, makefile string) []string {
	parsed := map[string]markdown{}
	for name, text := range files {
		parsed[name] = split(text)
	}
	targets := makefileTargets(makefile)
	var problems []string
	for name, md := range parsed {
		for _, target := range links(md) {
			if external.MatchString(target) {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			resolved := name
			if file != "" {
				resolved = path.Clean(path.Join(path.Dir(name), file))
				if resolved == ".." || strings.HasPrefix(resolved, "../") || !exists(resolved) {
					problems = append(problems, fmt.Sprintf("%s: link %q: %s does not exist", name, target, resolved))
					continue
				}
			}
			if anchor == "" {
				continue
			}
			other, ok := parsed[resolved]
			if !ok {
				if !strings.HasSuffix(resolved, ".md") || !exists(resolved) {
					problems = append(problems, fmt.Sprintf("%s: link %q: an anchor into %s, which is not markdown", name, target, resolved))
					continue
				}
				text, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(resolved)))
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s: link %q: %v", name, target, err))
					continue
				}
				other = split(string(text))
				parsed[resolved] = other
			}
			if !anchors(other)[anchor] {
				problems = append(problems, fmt.Sprintf("%s: link %q: %s has no heading whose anchor is #%s", name, target, resolved, anchor))
			}
		}
		for _, target := range makeTargets(md) {
			if !targets[target] {
				problems = append(problems, fmt.Sprintf("%s: `make %s`: the Makefile has no target %s", name, target, target))
			}
		}
	}
	sort.Strings(problems)
	return problems
}

// Every relative link of README.md and docs/*.md reaches a file that
// exists, every #anchor a heading of its file (GitHub's slugs), and every
// `make X` shown names a target of the Makefile.
func TestDocLinksAndMakeTargetsResolve(t *testing.T) {
	makefile, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	files := docFiles(t)
	exists := func(rel string) bool {
		_, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(rel)))
		return err == nil
	}
	for _, p := range checkDocs(files, exists, string(makefile)) {
		t.Error(p)
	}
	var nLinks, nTargets int
	for _, text := range files {
		md := split(text)
		nLinks += len(links(md))
		nTargets += len(makeTargets(md))
	}
	if nLinks == 0 || nTargets == 0 {
		t.Fatalf("%d links and %d make commands found in %d files: the extraction is broken", nLinks, nTargets, len(files))
	}
}

// The checker finds each kind of breakage, and leaves code, external links
// and prose alone.
func TestCheckDocsFindsBrokenLinks(t *testing.T) {
	files := map[string]string{
		"README.md": strings.Join([]string{
			"# idemgate",
			"## Quick start: `make run`",
			"See [the guide](docs/guide.md#calling-it-with-a-key), [here](#quick-start-make-run),",
			"[gone](docs/gone.md), [bad anchor](docs/guide.md#nothing), [self](#nowhere),",
			"[licence](LICENSE), [outside](../etc/passwd), [web](https://example.com/#x).",
			"Run `make run`, `make fuzz FUZZ_TIME=10x` and `make nosuch`; make it compile.",
			"```sh",
			"# not a heading",
			"make run          # the service",
			"[code](nowhere.md)",
			"```",
			"`[span](nowhere.md)`",
		}, "\n"),
		"docs/guide.md": strings.Join([]string{
			"# Guide",
			"## 1. Calling it with a key",
			"## Calling it with a key",
			"## Calling it with a key",
			"Back to the [README](../README.md#idemgate) and [policies](policies.md#missing).",
			"  ```text",
			"  make bogus",
			"  ```",
		}, "\n"),
	}
	exists := func(rel string) bool {
		return rel == "README.md" || rel == "docs/guide.md" || rel == "LICENSE"
	}
	makefile := ".PHONY: run\nrun: bin/x ## Run.\n\t./bin/x\nfuzz: ## Fuzz.\nFUZZ_TIME ?= 1x\nBINS := a b\n"
	got := checkDocs(files, exists, makefile)
	want := []string{
		`README.md: ` + "`make nosuch`" + `: the Makefile has no target nosuch`,
		`README.md: link "#nowhere": README.md has no heading whose anchor is #nowhere`,
		`README.md: link "../etc/passwd": ../etc/passwd does not exist`,
		`README.md: link "docs/gone.md": docs/gone.md does not exist`,
		`README.md: link "docs/guide.md#nothing": docs/guide.md has no heading whose anchor is #nothing`,
		`docs/guide.md: ` + "`make bogus`" + `: the Makefile has no target bogus`,
		`docs/guide.md: link "policies.md#missing": docs/policies.md does not exist`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("checkDocs found:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The repeated heading gets GitHub's -1; "1." keeps its digit.
	a := anchors(split(files["docs/guide.md"]))
	for _, s := range []string{"guide", "1-calling-it-with-a-key", "calling-it-with-a-key", "calling-it-with-a-key-1"} {
		if !a[s] {
			t.Errorf("docs/guide.md has no anchor %q: %v", s, a)
		}
	}
	if got := slug("Native Go MCP servers: `mcpgate`"); got != "native-go-mcp-servers-mcpgate" {
		t.Errorf("slug = %q", got)
	}
	if got := slug("1. Annotate the methods in your .proto"); got != "1-annotate-the-methods-in-your-proto" {
		t.Errorf("slug = %q", got)
	}
}

package adoptertest

import (
	"fmt"
	"path"
	"regexp"
	"strings"
	"testing"
)

// kind is what the test does with a block of the guide.
type kind int

const (
	runBlock    kind = iota // an sh block, run in order
	fileBlock               // written to its path
	outputBlock             // compared with the stdout of the run block before it
	envBlock                // replaced by the test's own variables
	shownBlock              // not run: shown only
)

// block is one fenced code block of the guide.
type block struct {
	kind kind
	// line is the guide's line of the opening fence, for messages.
	line int
	// lang is the fence's info string ("sh", "go", ...).
	lang string
	// path is a file block's path, relative to the directory the guide
	// works in.
	path string
	// needs names what a run block needs beyond the rest ("python3-grpcio").
	needs string
	// of is, for an output block, the index of the run block it shows.
	of   int
	body string
}

// knownNeeds are the needs a run block may name.
var knownNeeds = map[string]bool{"python3-grpcio": true}

var annotation = regexp.MustCompile(`^<!--\s*(file|output|env|needs|not run)\s*(?::\s*(.*?))?\s*-->$`)

// parseGuide splits the guide's markdown into its fenced blocks and reads
// the annotation on the line before each fence.
func parseGuide(text string) ([]block, error) {
	lines := strings.Split(text, "\n")
	var blocks []block
	lastRun := -1
	env := false
	for i := 0; i < len(lines); i++ {
		info, ok := strings.CutPrefix(lines[i], "```")
		if !ok {
			continue
		}
		b := block{line: i + 1, lang: strings.TrimSpace(info), kind: runBlock}
		if b.lang == "" {
			return nil, fmt.Errorf("line %d: a fence without a language", b.line)
		}
		var body []string
		closed := false
		for i++; i < len(lines); i++ {
			if lines[i] == "```" {
				closed = true
				break
			}
			body = append(body, lines[i])
		}
		if !closed {
			return nil, fmt.Errorf("line %d: the fence is not closed", b.line)
		}
		b.body = strings.Join(body, "\n") + "\n"
		prev := ""
		if b.line >= 2 {
			prev = strings.TrimSpace(lines[b.line-2])
		}
		m := annotation.FindStringSubmatch(prev)
		switch {
		case m == nil && strings.HasPrefix(prev, "<!--"):
			return nil, fmt.Errorf("line %d: unknown annotation %q", b.line, prev)
		case m == nil && b.lang != "sh":
			return nil, fmt.Errorf("line %d: a %s block without an annotation: mark it <!-- file: PATH -->, <!-- output --> or <!-- not run: why -->", b.line, b.lang)
		case m == nil:
			b.kind = runBlock
		case m[1] == "file":
			p := m[2]
			if p == "" || path.IsAbs(p) || path.Clean(p) != p || strings.HasPrefix(p, "../") {
				return nil, fmt.Errorf("line %d: file path %q must be clean and relative, inside the guide's directory", b.line, p)
			}
			b.kind, b.path = fileBlock, p
		case m[1] == "output":
			if lastRun < 0 || blocks[len(blocks)-1].kind != runBlock {
				return nil, fmt.Errorf("line %d: an output block must follow the sh block it shows, with no block between", b.line)
			}
			b.kind, b.of = outputBlock, lastRun
		case m[1] == "env":
			if b.lang != "sh" || env {
				return nil, fmt.Errorf("line %d: the env block must be the guide's one sh block marked env", b.line)
			}
			env, b.kind = true, envBlock
		case m[1] == "needs":
			if b.lang != "sh" || !knownNeeds[m[2]] {
				return nil, fmt.Errorf("line %d: <!-- needs: %s --> on a %s block: only sh blocks, needing one of %v", b.line, m[2], b.lang, knownNeeds)
			}
			b.kind, b.needs = runBlock, m[2]
		case m[1] == "not run":
			if m[2] == "" {
				return nil, fmt.Errorf("line %d: <!-- not run --> must say why: <!-- not run: REASON -->", b.line)
			}
			b.kind = shownBlock
		}
		if b.kind == runBlock && b.lang != "sh" {
			return nil, fmt.Errorf("line %d: only sh blocks run, not %s", b.line, b.lang)
		}
		if b.kind == runBlock {
			lastRun = len(blocks)
		}
		blocks = append(blocks, b)
	}
	return blocks, nil
}

// envVars returns the names the env block exports, in order.
func envVars(b block) ([]string, error) {
	var names []string
	for _, line := range strings.Split(b.body, "\n") {
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		rest, ok := strings.CutPrefix(line, "export ")
		if !ok {
			return nil, fmt.Errorf("line %d: env block line %q is not an export", b.line, line)
		}
		for _, assign := range strings.Fields(rest) {
			name, _, ok := strings.Cut(assign, "=")
			if !ok || !regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`).MatchString(name) {
				return nil, fmt.Errorf("line %d: %q is not NAME=value", b.line, assign)
			}
			names = append(names, name)
		}
	}
	return names, nil
}

// outputLines is text as the comparison sees it: each line without its
// surrounding blanks, no trailing empty lines.
func outputLines(text string) []string {
	lines := strings.Split(text, "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	for len(lines) > 0 && lines[0] == "" {
		lines = lines[1:]
	}
	return lines
}

func TestParseGuide(t *testing.T) {
	good := "intro\n\n<!-- env -->\n```sh\nexport A=1 B=2   # two\nexport C='x'\n```\n\n```sh\necho hi\n```\n\n<!-- output -->\n```text\nhi\n```\n\n" +
		"<!-- file: a/b.go -->\n```go\npackage b\n```\n\n<!-- not run: later -->\n```sh\nrm -rf /\n```\n\n<!-- needs: python3-grpcio -->\n```sh\npython3\n```\n"
	blocks, err := parseGuide(good)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []kind
	for _, b := range blocks {
		kinds = append(kinds, b.kind)
	}
	if want := []kind{envBlock, runBlock, outputBlock, fileBlock, shownBlock, runBlock}; fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Fatalf("kinds %v, want %v", kinds, want)
	}
	if b := blocks[2]; b.of != 1 || b.body != "hi\n" {
		t.Errorf("output block %+v: want of 1, body hi", b)
	}
	if b := blocks[3]; b.path != "a/b.go" || b.body != "package b\n" {
		t.Errorf("file block %+v", b)
	}
	if blocks[5].needs != "python3-grpcio" {
		t.Errorf("needs %q", blocks[5].needs)
	}
	names, err := envVars(blocks[0])
	if err != nil || fmt.Sprint(names) != "[A B C]" {
		t.Errorf("env vars %v, %v; want [A B C]", names, err)
	}

	for name, bad := range map[string]string{
		"unannotated go":          "```go\npackage a\n```\n",
		"unannotated text":        "```text\nhi\n```\n",
		"output without run":      "<!-- output -->\n```text\nhi\n```\n",
		"output after a file":     "```sh\necho\n```\n<!-- file: x -->\n```go\nx\n```\n<!-- output -->\n```text\nhi\n```\n",
		"file outside":            "<!-- file: ../x -->\n```go\nx\n```\n",
		"file absolute":           "<!-- file: /etc/x -->\n```go\nx\n```\n",
		"not run without reason":  "<!-- not run -->\n```sh\nx\n```\n",
		"unknown annotation":      "<!-- skip -->\n```sh\nx\n```\n",
		"unknown need":            "<!-- needs: rust -->\n```sh\nx\n```\n",
		"unclosed":                "```sh\necho\n",
		"two env blocks":          "<!-- env -->\n```sh\nexport A=1\n```\n<!-- env -->\n```sh\nexport B=1\n```\n",
		"fence without language":  "```\nx\n```\n",
		"a needs on a file block": "<!-- needs: python3-grpcio -->\n```python\nx\n```\n",
	} {
		if _, err := parseGuide(bad); err == nil {
			t.Errorf("%s: parsed without an error", name)
		}
	}
	if _, err := envVars(block{body: "A=1\n"}); err == nil {
		t.Error("an env line without export parsed")
	}
	if got := outputLines("\n  a \n\tb\n\n"); fmt.Sprint(got) != "[a b]" {
		t.Errorf("outputLines = %q", got)
	}
}

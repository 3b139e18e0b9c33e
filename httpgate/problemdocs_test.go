package httpgate

import (
	"bufio"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// docsTableRow is one row of docs/gating.md "What an HTTP caller does with
// each refusal".
type docsTableRow struct {
	reason, anchor, retryAfter, got, todo string
	status                                int
}

// docsTable parses that table.
func docsTable(t *testing.T) []docsTableRow {
	t.Helper()
	raw, err := os.ReadFile("../docs/gating.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "\n### What an HTTP caller does with each refusal\n")
	if start < 0 {
		t.Fatal(`docs/gating.md has no "What an HTTP caller does with each refusal" section`)
	}
	row := regexp.MustCompile("^\\| \\[`([A-Z_]+)`\\]\\(#([a-z0-9_-]+)\\) \\| (\\d{3}) \\| ([^|]+) \\| ([^|]+) \\| ([^|]+) \\|$")
	var rows []docsTableRow
	for _, line := range strings.Split(doc[start:], "\n") {
		if strings.HasPrefix(line, "## ") {
			break
		}
		if !strings.HasPrefix(line, "| [`") {
			continue
		}
		m := row.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("a row of the table does not parse: %s", line)
		}
		status, _ := strconv.Atoi(m[3])
		rows = append(rows, docsTableRow{reason: m[1], anchor: m[2], status: status,
			retryAfter: strings.TrimSpace(m[4]), got: strings.TrimSpace(m[5]), todo: strings.TrimSpace(m[6])})
	}
	return rows
}

// gotRetries is what got 14 does with a POST (POST added to its methods)
// answered status: its default statusCodes, of which 413 only with
// Retry-After.
func gotRetries(status int, retryAfter bool) bool {
	switch status {
	case 408, 429, 500, 502, 503, 504, 521, 522, 524:
		return true
	case 413:
		return retryAfter
	}
	return false
}

// TestDocsTableIsTheCodesMapping holds the table callers read
// (docs/gating.md) and the package documentation's to the statuses and
// Retry-After the gate answers, and the table's advice to what a generic
// retrier does: a refusal to escalate never has a status got retries, and
// one to retry carries Retry-After.
func TestDocsTableIsTheCodesMapping(t *testing.T) {
	rows := docsTable(t)
	seen := map[string]bool{}
	words := map[string]retryAfter{"no": retryNever, "yes": retryAlways, "for a rate quota": retryRate}
	for _, r := range rows {
		seen[r.reason] = true
		want, ok := refusals[r.reason]
		if !ok {
			t.Errorf("the docs list %s, which httpgate does not answer", r.reason)
			continue
		}
		if r.status != want.status || r.status != StatusOf(r.reason) {
			t.Errorf("%s: the docs say %d, the gate answers %d", r.reason, r.status, want.status)
		}
		if w, ok := words[r.retryAfter]; !ok || w != want.retry {
			t.Errorf("%s: the docs say Retry-After %q, the gate's is %d", r.reason, r.retryAfter, want.retry)
		}
		if r.anchor != strings.TrimPrefix(ProblemType(DefaultProblemTypeBase, r.reason), DefaultProblemTypeBase) {
			t.Errorf("%s links #%s, not its problem type %s", r.reason, r.anchor, ProblemType(DefaultProblemTypeBase, r.reason))
		}
		retried := gotRetries(want.status, want.retry != retryNever)
		if r.got != map[bool]string{true: "retried", false: "not retried"}[retried] {
			t.Errorf("%s: the docs say got's answer is %q; by its defaults it is retried: %v", r.reason, r.got, retried)
		}
		if strings.HasPrefix(r.todo, "escalate") && (retried || want.retry != retryNever) {
			t.Errorf("%s: to escalate, but answered %d (Retry-After %d), which a generic retrier retries", r.reason, r.status, want.retry)
		}
		if strings.HasPrefix(r.todo, "retry") && want.retry == retryNever {
			t.Errorf("%s: to retry, but answered without Retry-After", r.reason)
		}
	}
	for reason := range refusals {
		if !seen[reason] {
			t.Errorf("the docs' table leaves out %s", reason)
		}
	}

	// doc.go's table.
	raw, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`^//\t(\d{3}) (IDEMPOTENCY_[A-Z_]+) `)
	documented := 0
	for _, l := range strings.Split(string(raw), "\n") {
		if m := line.FindStringSubmatch(l); m != nil {
			documented++
			if status, _ := strconv.Atoi(m[1]); status != StatusOf(m[2]) {
				t.Errorf("doc.go: %s %d, the gate answers %d", m[2], status, StatusOf(m[2]))
			}
		}
	}
	if documented != len(refusals) {
		t.Errorf("doc.go lists %d refusals, the gate has %d", documented, len(refusals))
	}
}

// TestProblemTypesResolveToDocsSections checks that every refusal's default
// problem type is a section of docs/gating.md on GitHub: the page's blob
// URL and a fragment that is one of its headings' anchors, computed as
// GitHub does.
func TestProblemTypesResolveToDocsSections(t *testing.T) {
	anchors := githubAnchors(t, "../docs/gating.md")
	const page = "https://github.com/idemgate/idemgate/blob/main/docs/gating.md#"
	if DefaultProblemTypeBase != page {
		t.Fatalf("DefaultProblemTypeBase = %q, want %q", DefaultProblemTypeBase, page)
	}
	for reason := range refusals {
		typ := ProblemType(DefaultProblemTypeBase, reason)
		if fragment := strings.TrimPrefix(typ, page); !anchors[fragment] {
			t.Errorf("%s: type %s names no heading of docs/gating.md", reason, typ)
		}
	}
	if !anchors["what-an-http-caller-does-with-each-refusal"] {
		t.Error("docs/gating.md lost its table's heading")
	}
}

// githubAnchors returns the anchors GitHub gives the headings of the
// Markdown file path: the text without formatting, in lower case, without
// punctuation but hyphens and underscores, spaces as hyphens, and "-1",
// "-2", ... after a repeated one. Fenced code is not headings.
func githubAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	anchors := map[string]bool{}
	counts := map[string]int{}
	fenced := false
	link := regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		text, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if fenced || !strings.HasPrefix(line, "#") || !ok || len(line)-len(strings.TrimLeft(line, "#")) > 6 {
			continue
		}
		text = link.ReplaceAllString(text, "$1")
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(text)) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		anchor := b.String()
		if n := counts[anchor]; n > 0 {
			counts[anchor]++
			anchor += "-" + strconv.Itoa(n)
		} else {
			counts[anchor] = 1
		}
		anchors[anchor] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(anchors) == 0 {
		t.Fatalf("%s has no headings", path)
	}
	return anchors
}

// TestGitHubAnchors checks githubAnchors on headings whose anchors GitHub
// is known to give (this repository's own links to them).
func TestGitHubAnchors(t *testing.T) {
	anchors := githubAnchors(t, "../docs/gating.md")
	for _, want := range []string{"1-annotate-the-methods-in-your-proto", "2-register-the-interceptor",
		"the-example-tool-servers-options", "idempotency-key-missing"} {
		if !anchors[want] {
			t.Errorf("no anchor %q among %v", want, slices.Sorted(maps.Keys(anchors)))
		}
	}
}

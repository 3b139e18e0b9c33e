package readmetest

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// metricName is a Prometheus metric the code registers, named in full,
// idemgate_ and its subsystem included, as a collector's Name or a Desc's
// name. A name built at run time is not seen here:
// TestEveryMetricTheServiceAndGatesRegisterIsDocumented asks the collectors.
var metricName = regexp.MustCompile(`(?:\bName:\s*|\bNewDesc\()"(idemgate_[a-z0-9_]+)"`)

// registeredMetrics returns the metric names the repository's non-test Go
// code registers, with the file of each.
func registeredMetrics(t *testing.T) map[string]string {
	t.Helper()
	found := map[string]string{}
	err := filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "gen", "node_modules", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range metricName.FindAllStringSubmatch(string(b), -1) {
			rel, _ := filepath.Rel(repoRoot, p)
			found[m[1]] = filepath.ToSlash(rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// Every metric the code registers is named in the docs (README.md or
// docs/*.md), so an operator reading them can find what it measures: a new
// metric left out of the docs fails here.
func TestEveryMetricIsDocumented(t *testing.T) {
	var docs strings.Builder
	for _, text := range docFiles(t) {
		docs.WriteString(text)
	}
	metrics := registeredMetrics(t)
	if len(metrics) < 10 {
		t.Fatalf("found %d registered metrics: the extraction is broken", len(metrics))
	}
	var missing []string
	for name, file := range metrics {
		if !regexp.MustCompile(`\b` + name + `\b`).MatchString(docs.String()) {
			missing = append(missing, name+" (registered in "+file+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("metric %s is not named in README.md or docs/*.md", m)
	}
}

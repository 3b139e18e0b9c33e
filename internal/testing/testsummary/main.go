// Command testsummary runs go test -json (or reads its events on standard
// input), prints what go test without -v would (each package's ok or FAIL
// line, the output of failed tests, build errors), and ends with the tests
// that skipped and why, with what to install for none to skip. A skip in a
// plain go test run is invisible behind the package's "ok"; `make test` runs
// through this so that a missing tool is seen.
//
// Usage:
//
//	testsummary go test -json ./...   # runs the command, exits as it did
//	go test -json ./... | testsummary # reads the events
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
)

// event is one line of test2json's output (go doc test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// skip is one skipped test and the lines it logged before skipping.
type skip struct {
	pkg, test, reason string
}

// report is what a stream of events came to.
type report struct {
	failed bool
	skips  []skip
}

// fileLine is the file:line: prefix testing puts before a logged line.
var fileLine = regexp.MustCompile(`^\s*[\w.-]+\.go:\d+: `)

// aptInstall and fixCommand find the remedy a skip message names: Debian
// packages to install, or the Node packages (make npm-ci, npm ci in a dir).
// Another make target a message names (make chaos, an opt-in suite's) is no
// install, and not listed as one.
var (
	aptInstall = regexp.MustCompile(`apt-get install((?: +[a-z0-9][a-z0-9.+-]*)+)`)
	fixCommand = regexp.MustCompile(`\b(make npm-ci|npm ci in [^\s:;,)]+)`)
)

// summarize copies r's events to w as go test without -v prints them, then
// writes the skipped tests and their remedies.
func summarize(r io.Reader, w io.Writer) (report, error) {
	var rep report
	buffered := map[[2]string][]string{} // (package, test): its output so far
	var order [][2]string                // tests in the order they started
	flush := func(k [2]string, keepResult bool) {
		for _, line := range buffered[k] {
			if framing(line) && !(keepResult && strings.HasPrefix(strings.TrimSpace(line), "--- ")) {
				continue
			}
			io.WriteString(w, line)
		}
		delete(buffered, k)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		k := [2]string{e.Package, e.Test}
		switch {
		case e.Action == "build-output":
			io.WriteString(w, e.Output)
		case e.Action == "build-fail":
			rep.failed = true
		case e.Test == "" && e.Action == "output":
			if strings.TrimSpace(e.Output) != "PASS" {
				io.WriteString(w, e.Output)
			}
		case e.Test == "" && e.Action == "fail":
			rep.failed = true
			// Tests of the package that never ended (a panic, a timeout):
			// their output is what explains the failure.
			for _, o := range order {
				if o[0] == e.Package {
					if _, ok := buffered[o]; ok {
						flush(o, true)
					}
				}
			}
		case e.Test == "":
		case e.Action == "run":
			if _, ok := buffered[k]; !ok {
				buffered[k] = nil
				order = append(order, k)
			}
		case e.Action == "output":
			if _, ok := buffered[k]; !ok {
				order = append(order, k)
			}
			buffered[k] = append(buffered[k], e.Output)
		case e.Action == "fail":
			rep.failed = true
			flush(k, true)
		case e.Action == "skip":
			rep.skips = append(rep.skips, skip{pkg: e.Package, test: e.Test, reason: reason(buffered[k])})
			delete(buffered, k)
		case e.Action == "pass":
			delete(buffered, k)
		}
	}
	if err := sc.Err(); err != nil {
		return rep, err
	}
	writeSkips(w, rep.skips)
	return rep, nil
}

// framing reports whether line is one of testing's own markers, which go
// test without -v does not print: === RUN, PAUSE, CONT, NAME and the ---
// result lines of tests that did not fail.
func framing(line string) bool {
	t := strings.TrimSpace(line)
	return strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- PASS") || strings.HasPrefix(t, "--- SKIP") || strings.HasPrefix(t, "--- FAIL")
}

// reason is what a skipped test logged, on one line, without the file:line
// prefixes and testing's markers.
func reason(lines []string) string {
	var parts []string
	for _, l := range lines {
		if framing(l) {
			continue
		}
		if s := strings.TrimSpace(fileLine.ReplaceAllString(l, "")); s != "" {
			parts = append(parts, s)
		}
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " ")
}

// writeSkips writes the skipped tests, grouped by package and reason, then
// the remedies their reasons name.
func writeSkips(w io.Writer, skips []skip) {
	if len(skips) == 0 {
		fmt.Fprintln(w, "testsummary: no test skipped")
		return
	}
	type group struct {
		pkg, reason string
		tests       []string
	}
	var groups []*group
	byKey := map[[2]string]*group{}
	for _, s := range skips {
		k := [2]string{s.pkg, s.reason}
		g := byKey[k]
		if g == nil {
			g = &group{pkg: s.pkg, reason: s.reason}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.tests = append(g.tests, s.test)
	}
	sort.SliceStable(groups, func(i, j int) bool { return groups[i].pkg < groups[j].pkg })
	noun := "tests"
	if len(skips) == 1 {
		noun = "test"
	}
	fmt.Fprintf(w, "\ntestsummary: %d %s skipped:\n", len(skips), noun)
	pkgs, fixes := map[string]bool{}, map[string]bool{}
	var pkgList, fixList []string
	for _, g := range groups {
		fmt.Fprintf(w, "  %s %s: %s\n", g.pkg, strings.Join(g.tests, ", "), g.reason)
		for _, m := range aptInstall.FindAllStringSubmatch(g.reason, -1) {
			for _, p := range strings.Fields(m[1]) {
				if !pkgs[p] {
					pkgs[p] = true
					pkgList = append(pkgList, p)
				}
			}
		}
		for _, m := range fixCommand.FindAllString(g.reason, -1) {
			if strings.HasPrefix(m, "npm ci in ") {
				m = "make npm-ci" // installs every directory's packages
			}
			if !fixes[m] {
				fixes[m] = true
				fixList = append(fixList, m)
			}
		}
	}
	var remedies []string
	if len(pkgList) > 0 {
		remedies = append(remedies, "apt-get install "+strings.Join(pkgList, " "))
	}
	remedies = append(remedies, fixList...)
	if len(remedies) > 0 {
		fmt.Fprintf(w, "testsummary: %d %s skipped; install for nothing to skip: %s\n", len(skips), noun, strings.Join(remedies, "; "))
	} else {
		fmt.Fprintf(w, "testsummary: %d %s skipped (see the reasons above)\n", len(skips), noun)
	}
}

func main() {
	args := os.Args[1:]
	in := io.Reader(os.Stdin)
	var cmd *exec.Cmd
	if len(args) > 0 {
		cmd = exec.Command(args[0], args[1:]...)
		cmd.Stdin, cmd.Stderr = os.Stdin, os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			os.Exit(2)
		}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			os.Exit(2)
		}
		in = out
	}
	rep, err := summarize(in, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary: reading the events:", err)
	}
	code := 0
	if cmd != nil {
		if werr := cmd.Wait(); werr != nil {
			var ee *exec.ExitError
			if errors.As(werr, &ee) && ee.ExitCode() > 0 {
				code = ee.ExitCode()
			} else {
				fmt.Fprintln(os.Stderr, "testsummary:", werr)
				code = 2
			}
		}
	}
	if code == 0 && (rep.failed || err != nil) {
		code = 1
	}
	os.Exit(code)
}

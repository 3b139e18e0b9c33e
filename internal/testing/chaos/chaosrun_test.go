package chaos

import (
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// selected returns the scenarios `make chaos CHAOS_RUN=run` runs: the -run
// pattern make passes, matched level by level against each scenario's
// subtest name as go test matches subtests (each '/'-separated element its
// own regular expression).
func selected(t *testing.T, run string) []string {
	t.Helper()
	out, err := exec.Command("make", "-s", "-n", "-C", "../../..", "chaos", "CHAOS_RUN="+run).Output()
	if err != nil {
		t.Fatalf("make -n chaos: %v", err)
	}
	m := regexp.MustCompile(`-run '([^']*)'`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("make -n chaos CHAOS_RUN=%s printed no -run pattern:\n%s", run, out)
	}
	levels := strings.Split(m[1], "/")
	var names []string
	for _, s := range scenarios() {
		name := append([]string{"TestChaos"}, strings.Split(s.Name, "/")...)
		ok := true
		for i, level := range levels {
			if i < len(name) && !regexp.MustCompile(level).MatchString(name[i]) {
				ok = false
			}
		}
		if ok {
			names = append(names, s.Name)
		}
	}
	return names
}

// CHAOS_RUN selects the scenarios whose names start as it says, level by
// level, not every name that contains it: postgres/network names the two
// gRPC network scenarios, not the HTTP and Connect variants whose names
// contain "network" further in.
func TestChaosRunSelectsByNamePrefix(t *testing.T) {
	for _, c := range []struct {
		run  string
		want []string
	}{
		{"postgres/network", []string{"postgres/network-caller-side", "postgres/network-dedupe-side"}},
		{"postgres/dedupe-killed", []string{"postgres/dedupe-killed"}},
		{"sqlite/dedupe", []string{"sqlite/dedupe-killed"}},
	} {
		got := selected(t, c.run)
		slices.Sort(got)
		if !slices.Equal(got, c.want) {
			t.Errorf("make chaos CHAOS_RUN=%s runs %v, want %v", c.run, got, c.want)
		}
	}
	if all, n := selected(t, ""), len(scenarios()); len(all) != n {
		t.Errorf("make chaos with no CHAOS_RUN runs %d of the %d scenarios", len(all), n)
	}
}

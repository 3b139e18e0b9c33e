package incident

import "testing"

// Every action is either done as its row promises or counted not done; the
// demo fails on anything else.
func TestUnexplainedActions(t *testing.T) {
	t.Parallel()
	done, notDone, unsent := actionResult{sent: true, done: true}, actionResult{sent: true}, actionResult{}
	reemitted := actionResult{sent: true, done: true, reemitted: true}
	for _, c := range []struct {
		name     string
		kind     keying
		res      actionResult
		executed int64
		bad      bool
	}{
		{"gated, done once", orchestrated, done, 1, false},
		{"gated, done twice", orchestrated, done, 2, true},
		{"gated, done without running", orchestrated, done, 0, true},
		{"gated, not done, never ran", orchestrated, notDone, 0, false},
		{"gated, not done, ran once", orchestrated, notDone, 1, false},
		{"gated, not done, ran twice", orchestrated, notDone, 2, true},
		{"gated, never sent, ran", orchestrated, unsent, 1, true},
		{"gated, never sent", orchestrated, unsent, 0, false},
		{"gated, re-emitted, ran twice", orchestrated, reemitted, 2, true},
		{"fresh keys, re-emitted, ran twice", freshModel, reemitted, 2, false},
		{"fresh keys, re-emitted, ran three times", freshModel, reemitted, 3, true},
		{"fresh keys, not re-emitted, ran twice", freshModel, done, 2, true},
		{"ungated, ran three times", ungated, done, 3, false},
		{"ungated, done without running", ungated, done, 0, true},
	} {
		if got := c.kind.unexplained(c.res, c.executed); (got != "") != c.bad {
			t.Errorf("%s: unexplained %q, want unexplained: %v", c.name, got, c.bad)
		}
	}
}

// The demo fails on a call the simulation did not fail, and on a default
// run whose numbers are not the README's; it does not on the simulation's
// own errors, nor on another configuration's numbers.
func TestProblems(t *testing.T) {
	t.Parallel()
	var cfg Config
	cfg.defaults()
	clean := func() Report {
		r := Report{Config: cfg}
		for _, s := range []*Scenario{&r.Ungated, &r.Gated, &r.FreshKey} {
			*s = Scenario{Actions: 600, Calls: 704, Executed: 600, Errors: map[string]int{}, Unexpected: map[string]int{}}
		}
		r.Ungated.Name, r.Gated.Name, r.FreshKey.Name = "without idemgate", "idemgate, key from the orchestration layer", "idemgate, model re-emits with its own key"
		return r
	}
	fromTable := clean()
	fromTable.Ungated.Calls, fromTable.Ungated.Executed, fromTable.Ungated.Duplicates = 706, 706, 106
	fromTable.Gated.Replays = 104
	fromTable.FreshKey.Executed, fromTable.FreshKey.Duplicates, fromTable.FreshKey.Replays = 641, 41, 63
	if got := fromTable.Table(); got != DefaultTable {
		t.Fatalf("the report built from DefaultTable prints:\n%s", got)
	}
	if p := fromTable.Problems(); len(p) > 0 {
		t.Errorf("the README's numbers are problems: %v", p)
	}

	r := fromTable
	r.Gated.Errors = map[string]int{"DeadlineExceeded": 1}
	other := r
	other.Config.Orders = 40 // another configuration: its numbers are its own
	other.Gated.Calls = 50
	if p := other.Problems(); len(p) > 0 {
		t.Errorf("another configuration's numbers are problems: %v", p)
	}

	wrong := fromTable
	wrong.Gated.Calls = 902
	if p := wrong.Problems(); len(p) != 1 {
		t.Errorf("a default run with other numbers: problems %v, want one", p)
	}
	refused := other
	refused.Gated.Unexpected = map[string]int{"IDEMPOTENCY_QUOTA_EXCEEDED": 3}
	if p := refused.Problems(); len(p) != 1 {
		t.Errorf("calls refused by the service: problems %v, want one", p)
	}

	if !simulated(errSlow) || !simulated(errLost) {
		t.Error("the simulation's own errors are not recognised")
	}
}

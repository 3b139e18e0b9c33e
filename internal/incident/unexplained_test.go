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

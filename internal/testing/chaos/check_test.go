package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

const (
	failClosed = testingv1.ChaosService_Charge_FullMethodName
	reexecute  = testingv1.ChaosService_ChargeReexecute_FullMethodName
)

func ok(key, method string, caller int, body string, replayed bool) Attempt {
	return Attempt{Key: key, Action: key, Method: method, Caller: caller, Attempt: 1, Try: 1, Start: t0, End: t0.Add(time.Second),
		Code: "OK", Response: []byte(body), Replayed: replayed}
}

func unknown(key, method string, at time.Time) Attempt {
	return Attempt{Key: key, Action: key, Method: method, Attempt: 1, Try: 1, Start: at, End: at.Add(time.Millisecond),
		Code: "FailedPrecondition", Reason: reasonOutcomeUnknown}
}

// atTarget is a with its try made at target from start to end.
func atTarget(a Attempt, target string, start, end time.Time) Attempt {
	a.Target, a.Start, a.End = target, start, end
	return a
}

// run is one execution's ledger lines; errText, when set, ends it in error.
func run(key, method, server, body string, at time.Time, errText string) []LedgerEntry {
	e := LedgerEntry{Key: key, Action: key, Method: method, Server: server, Epoch: 1, Time: at}
	start, effect, end := e, e, e
	start.Event, effect.Event, end.Event = EventStart, EventEffect, EventEnd
	effect.Response = []byte(body)
	end.Error = errText
	return []LedgerEntry{start, effect, end}
}

func concat(runs ...[]LedgerEntry) []LedgerEntry {
	var all []LedgerEntry
	for _, r := range runs {
		all = append(all, r...)
	}
	return all
}

func TestCheck(t *testing.T) {
	t.Parallel()
	outage := []Outage{{What: "store down", Start: t0.Add(10 * time.Second), End: t0.Add(30 * time.Second)}}
	tests := []struct {
		name    string
		history []Attempt
		ledger  []LedgerEntry
		outages []Outage
		holders []HolderFault
		rules   Rules
		check   func(*Report) bool
		fails   bool
	}{
		{name: "one run, replayed", fails: false,
			history: []Attempt{ok("k", failClosed, 0, "r1", false), ok("k", failClosed, 1, "r1", true)},
			ledger:  run("k", failClosed, "tool0", "r1", t0, ""),
			check:   func(r *Report) bool { return r.Executions == 1 && r.OK == 2 && r.Replayed == 1 }},
		{name: "duplicate", fails: true,
			history: []Attempt{ok("k", failClosed, 0, "r1", false)},
			ledger:  concat(run("k", failClosed, "tool0", "r1", t0, ""), run("k", failClosed, "tool0", "r2", t0, "")),
			rules:   Rules{RerunAllowed: true, HolderFaults: true},
			check:   func(r *Report) bool { return r.Duplicates == 1 }},
		{name: "lost outcome", fails: true,
			history: []Attempt{ok("k", failClosed, 0, "r1", false)},
			check:   func(r *Report) bool { return r.LostOutcomes == 1 }},
		{name: "phantom response", fails: true,
			history: []Attempt{ok("k", failClosed, 0, "other", true)},
			ledger:  run("k", failClosed, "tool0", "r1", t0, ""),
			check:   func(r *Report) bool { return r.Phantoms == 1 }},
		{name: "non-identical replays under REEXECUTE", fails: true,
			history: []Attempt{ok("k", reexecute, 0, "r1", true), ok("k", reexecute, 1, "r2", true)},
			ledger:  concat(run("k", reexecute, "tool0", "r1", t0, ""), run("k", reexecute, "tool1", "r2", t0, "")),
			rules:   Rules{RerunAllowed: true, HolderFaults: true},
			check:   func(r *Report) bool { return r.NonIdentical == 1 && r.Reruns == 1 }},
		{name: "fenced holder's caller gets its own response", fails: true,
			history: []Attempt{ok("k", reexecute, 0, "r1", false), ok("k", reexecute, 1, "r2", false), ok("k", reexecute, 2, "r2", true)},
			ledger:  concat(run("k", reexecute, "tool0", "r1", t0, ""), run("k", reexecute, "tool1", "r2", t0, "")),
			rules:   Rules{RerunAllowed: true, HolderFaults: true},
			check:   func(r *Report) bool { return r.UnkeptAnswers == 1 && r.Reruns == 1 }},
		// Issue 31 item 1: a holder answered its caller at once when its
		// first Finish failed, was cut off past its lease, and a REEXECUTE
		// taker stored another outcome. No rule allows that answer.
		{name: "cut-off holder's caller gets an answer the key never keeps", fails: true,
			history: []Attempt{ok("k", reexecute, 0, "r1", false), ok("k", reexecute, 1, "r2", false), ok("k", reexecute, 2, "r2", true)},
			ledger:  concat(run("k", reexecute, "tool0", "r1", t0, ""), run("k", reexecute, "tool1", "r2", t0.Add(15*time.Second), "")),
			outages: []Outage{{What: "tool0 cut off", Start: t0.Add(time.Second), End: t0.Add(20 * time.Second), Servers: []string{"tool0"}}},
			rules:   Rules{RerunAllowed: true, HolderFaults: true, HolderCutOff: true, CutOffRerunAllowed: true},
			check:   func(r *Report) bool { return r.UnkeptAnswers == 1 && r.Reruns == 1 }},
		{name: "cut-off holder's caller told to retry, replays the taker's", fails: false,
			history: []Attempt{ok("k", reexecute, 0, "r2", true), ok("k", reexecute, 1, "r2", false), ok("k", reexecute, 2, "r2", true)},
			ledger:  concat(run("k", reexecute, "tool0", "r1", t0, ""), run("k", reexecute, "tool1", "r2", t0.Add(15*time.Second), "")),
			outages: []Outage{{What: "tool0 cut off", Start: t0.Add(time.Second), End: t0.Add(20 * time.Second), Servers: []string{"tool0"}}},
			rules:   Rules{HolderCutOff: true, CutOffRerunAllowed: true},
			check:   func(r *Report) bool { return r.Reruns == 1 && r.RerunsAfterCutOff == 1 && r.UnkeptAnswers == 0 }},
		{name: "re-run while another tool server was cut off", fails: true,
			history: []Attempt{ok("k", reexecute, 0, "r2", false)},
			ledger:  concat(run("k", reexecute, "tool0", "r1", t0, ""), run("k", reexecute, "tool1", "r2", t0.Add(15*time.Second), "")),
			outages: []Outage{{What: "tool1 cut off", Start: t0.Add(time.Second), End: t0.Add(20 * time.Second), Servers: []string{"tool1"}}},
			rules:   Rules{HolderCutOff: true, CutOffRerunAllowed: true},
			check:   func(r *Report) bool { return r.Reruns == 1 && r.RerunsAfterCutOff == 0 }},
		{name: "re-run after the holder's cut-off healed", fails: true,
			history: []Attempt{ok("k", reexecute, 0, "r2", false)},
			ledger:  concat(run("k", reexecute, "tool0", "r1", t0, ""), run("k", reexecute, "tool1", "r2", t0.Add(30*time.Second), "")),
			outages: []Outage{{What: "tool0 cut off", Start: t0.Add(time.Second), End: t0.Add(20 * time.Second), Servers: []string{"tool0"}}},
			rules:   Rules{HolderCutOff: true, CutOffRerunAllowed: true},
			check:   func(r *Report) bool { return r.Reruns == 1 && r.RerunsAfterCutOff == 0 }},
		{name: "FAIL_CLOSED unknown while its holder was cut off", fails: false,
			history: []Attempt{unknown("k", failClosed, t0.Add(8*time.Second)), ok("k", failClosed, 0, "r1", true)},
			ledger:  run("k", failClosed, "tool0", "r1", t0, ""),
			outages: []Outage{{What: "tool0 cut off", Start: t0.Add(time.Second), End: t0.Add(10 * time.Second), Servers: []string{"tool0"}}},
			rules:   Rules{HolderCutOff: true, CutOffRerunAllowed: true},
			check:   func(r *Report) bool { return r.UnknownsAfterCutOff == 1 && r.FalseUnknowns == 0 }},
		{name: "FAIL_CLOSED unknown, only another tool server cut off", fails: true,
			history: []Attempt{unknown("k", failClosed, t0.Add(8*time.Second)), ok("k", failClosed, 0, "r1", true)},
			ledger:  run("k", failClosed, "tool0", "r1", t0, ""),
			outages: []Outage{{What: "tool1 cut off", Start: t0.Add(time.Second), End: t0.Add(10 * time.Second), Servers: []string{"tool1"}}},
			rules:   Rules{HolderCutOff: true, CutOffRerunAllowed: true},
			check:   func(r *Report) bool { return r.FalseUnknowns == 1 }},
		{name: "FAIL_CLOSED unknown before its holder was cut off", fails: true,
			history: []Attempt{unknown("k", failClosed, t0.Add(500*time.Millisecond)), ok("k", failClosed, 0, "r1", true)},
			ledger:  run("k", failClosed, "tool0", "r1", t0, ""),
			outages: []Outage{{What: "tool0 cut off", Start: t0.Add(time.Second), End: t0.Add(10 * time.Second), Servers: []string{"tool0"}}},
			rules:   Rules{HolderCutOff: true, CutOffRerunAllowed: true},
			check:   func(r *Report) bool { return r.FalseUnknowns == 1 }},
		{name: "REEXECUTE re-run without a holder fault", fails: true,
			history: []Attempt{ok("k", reexecute, 0, "r2", false)},
			ledger:  concat(run("k", reexecute, "tool0", "r1", t0, ""), run("k", reexecute, "tool0", "r2", t0, "")),
			check:   func(r *Report) bool { return r.Reruns == 1 }},
		{name: "REEXECUTE re-run after a handler error", fails: false,
			history: []Attempt{ok("k", reexecute, 0, "r2", false)},
			ledger:  concat(run("k", reexecute, "tool0", "r1", t0, "timed out"), run("k", reexecute, "tool0", "r2", t0, "")),
			check:   func(r *Report) bool { return r.Reruns == 1 }},
		{name: "unknown for an action that never ran", fails: true,
			history: []Attempt{unknown("k", failClosed, t0)},
			rules:   Rules{RerunAllowed: true, HolderFaults: true},
			check:   func(r *Report) bool { return r.FalseUnknowns == 1 }},
		{name: "unknown for an action that never ran, its Begin's answer cut off", fails: false,
			history: []Attempt{unknown("k", failClosed, t0.Add(20*time.Second))},
			outages: outage,
			rules:   holderCutOff,
			check:   func(r *Report) bool { return r.FalseUnknowns == 0 && r.AttemptsDuringOutage == 1 }},
		{name: "unknown for an action that never ran, cut-off holder elsewhere", fails: true,
			history: []Attempt{unknown("k", failClosed, t0)},
			outages: outage,
			rules:   holderCutOff,
			check:   func(r *Report) bool { return r.FalseUnknowns == 1 }},
		{name: "unknown after a clean run with no holder fault", fails: true,
			history: []Attempt{unknown("k", failClosed, t0)},
			ledger:  run("k", failClosed, "tool0", "r1", t0, ""),
			check:   func(r *Report) bool { return r.FalseUnknowns == 1 }},
		{name: "unknown after an ambiguous failure", fails: false,
			history: []Attempt{unknown("k", failClosed, t0)},
			ledger:  run("k", failClosed, "tool0", "r1", t0, "timed out after charging"),
			check:   func(r *Report) bool { return r.Unknown == 1 && r.Unsettled == 1 }},
		{name: "unknown after a holder was killed", fails: false,
			history: []Attempt{unknown("k", failClosed, t0)},
			ledger:  run("k", failClosed, "tool0", "r1", t0, "")[:2],
			rules:   Rules{HolderFaults: true},
			check:   func(r *Report) bool { return r.Unknown == 1 }},
		{name: "execution while the store was away", fails: true,
			history: []Attempt{ok("k", failClosed, 0, "r1", false)},
			ledger:  run("k", failClosed, "tool0", "r1", t0.Add(20*time.Second), ""),
			outages: outage,
			check:   func(r *Report) bool { return r.ExecutionsDuringOutage == 1 && r.AttemptsDuringOutage == 0 }},
		{name: "execution at the outage's start is a Begin answered just before it", fails: false,
			history: []Attempt{ok("k", failClosed, 0, "r1", false)},
			ledger:  run("k", failClosed, "tool0", "r1", t0.Add(10*time.Second+time.Second), ""),
			outages: outage,
			check:   func(r *Report) bool { return r.ExecutionsDuringOutage == 0 }},
		{name: "outage of another tool's replica", fails: false,
			history: []Attempt{ok("k", failClosed, 0, "r1", false)},
			ledger:  run("k", failClosed, "tool0", "r1", t0.Add(20*time.Second), ""),
			outages: []Outage{{What: "replica", Start: outage[0].Start, End: outage[0].End, Servers: []string{"tool1"}}},
			check:   func(r *Report) bool { return r.ExecutionsDuringOutage == 0 }},
		{name: "execution of a key on another Citus worker than the one down", fails: false,
			history: []Attempt{ok("k", failClosed, 0, "r1", false)},
			ledger:  run("k", failClosed, "tool0", "r1", t0.Add(20*time.Second), ""),
			outages: []Outage{{What: "worker", Start: outage[0].Start, End: outage[0].End, Keys: func(key string) bool { return key != "k" }}},
			check:   func(r *Report) bool { return r.ExecutionsDuringOutage == 0 }},
		{name: "execution of a key on the Citus worker down", fails: true,
			history: []Attempt{ok("k", failClosed, 0, "r1", false)},
			ledger:  run("k", failClosed, "tool0", "r1", t0.Add(20*time.Second), ""),
			outages: []Outage{{What: "worker", Start: outage[0].Start, End: outage[0].End, Keys: func(key string) bool { return key == "k" }}},
			check:   func(r *Report) bool { return r.ExecutionsDuringOutage == 1 }},
		// A tool server killed while a try was at it: its Begin may have
		// reserved the key just before the process died, with no handler
		// started, so FAIL_CLOSED goes outcome-unknown and no run is seen.
		{name: "unknown with no run, try at a killed tool server, holder faults", fails: false,
			history: []Attempt{atTarget(unknown("k", failClosed, t0.Add(10*time.Second)), "tool0-addr", t0, t0.Add(5*time.Second))},
			holders: []HolderFault{{What: "killed tool0", Targets: []string{"tool0-addr"}, Start: t0.Add(2 * time.Second), End: t0.Add(2 * time.Second)}},
			rules:   Rules{RerunAllowed: true, HolderFaults: true},
			check:   func(r *Report) bool { return r.UnknownsAtHolderFault == 1 && r.FalseUnknowns == 0 }},
		{name: "unknown with no run, the kill after every try, holder faults", fails: true,
			history: []Attempt{atTarget(unknown("k", failClosed, t0.Add(10*time.Second)), "tool0-addr", t0, t0.Add(5*time.Second))},
			holders: []HolderFault{{What: "killed tool0", Targets: []string{"tool0-addr"}, Start: t0.Add(6 * time.Second), End: t0.Add(6 * time.Second)}},
			rules:   Rules{RerunAllowed: true, HolderFaults: true},
			check:   func(r *Report) bool { return r.FalseUnknowns == 1 }},
		{name: "unknown with no run, another tool server killed, holder faults", fails: true,
			history: []Attempt{atTarget(unknown("k", failClosed, t0.Add(10*time.Second)), "tool0-addr", t0, t0.Add(5*time.Second))},
			holders: []HolderFault{{What: "killed tool1", Targets: []string{"tool1-addr"}, Start: t0.Add(2 * time.Second), End: t0.Add(2 * time.Second)}},
			rules:   Rules{RerunAllowed: true, HolderFaults: true},
			check:   func(r *Report) bool { return r.FalseUnknowns == 1 }},
		{name: "unknown with no run, try at a killed tool server, strict rules", fails: true,
			history: []Attempt{atTarget(unknown("k", failClosed, t0.Add(10*time.Second)), "tool0-addr", t0, t0.Add(5*time.Second))},
			holders: []HolderFault{{What: "killed tool0", Targets: []string{"tool0-addr"}, Start: t0.Add(2 * time.Second), End: t0.Add(2 * time.Second)}},
			check:   func(r *Report) bool { return r.FalseUnknowns == 1 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := Check(tc.name, 7, tc.history, tc.ledger, 0, tc.outages, tc.holders, tc.rules)
			if r.Failed() != tc.fails || !tc.check(r) {
				t.Errorf("Failed() = %t, want %t; report:\n%s", r.Failed(), tc.fails, r)
			}
		})
	}
}

func TestReadLedgerCountsATornLastLine(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l, err := OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range run("k", failClosed, "tool0", "r1", t0, "") {
		if err := l.Append(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"event":"sta`); err != nil { // a SIGKILL mid-write
		t.Fatal(err)
	}
	_ = f.Close()
	entries, torn, err := ReadLedger(path, filepath.Join(t.TempDir(), "absent.jsonl"))
	if err != nil || len(entries) != 3 || torn != 1 {
		t.Fatalf("ReadLedger = %d entries, %d torn, %v; want 3, 1, nil", len(entries), torn, err)
	}
	if err := os.WriteFile(path, []byte("{bad\n{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadLedger(path); err == nil {
		t.Fatal("ReadLedger accepted a corrupt line before the last")
	}
}

// TestRequireReasons holds a scenario to the refusals its fault must cause:
// a run whose callers never saw one did not test the fault, and fails.
func TestRequireReasons(t *testing.T) {
	t.Parallel()
	refused := Attempt{Key: "k", Action: "k", Method: failClosed, Attempt: 1, Try: 1, Start: t0, End: t0.Add(time.Millisecond),
		Code: "Unavailable", Reason: reasonStoreUnavailable}
	history := []Attempt{refused, ok("k", failClosed, 0, "r1", false), ok("k", failClosed, 1, "r1", true)}
	ledger := run("k", failClosed, "tool0", "r1", t0, "")

	r := Check("saw it", 7, history, ledger, 0, nil, nil, Rules{})
	r.RequireReasons(reasonStoreUnavailable)
	if r.Failed() || r.Reasons[reasonStoreUnavailable] != 1 {
		t.Errorf("a run whose callers saw %s: Failed() = %t, Reasons = %v; report:\n%s", reasonStoreUnavailable, r.Failed(), r.Reasons, r)
	}

	r = Check("never saw it", 7, history[1:], ledger, 0, nil, nil, Rules{})
	r.RequireReasons(reasonStoreUnavailable, reasonInFlight)
	if !r.Failed() || len(r.Violations) != 2 {
		t.Errorf("a run whose callers saw neither %s nor %s: Failed() = %t, %d violations, want 2; report:\n%s",
			reasonStoreUnavailable, reasonInFlight, r.Failed(), len(r.Violations), r)
	}
}

// TestRequireSpared holds a partial outage (a Citus worker down) to the keys
// it spared: their tries while it lasted must be served, and a run with too
// few of them did not test it. The outage's own keys do not count, and the
// last refusal of one after the outage ended is measured.
func TestRequireSpared(t *testing.T) {
	t.Parallel()
	start, end := t0.Add(10*time.Second), t0.Add(20*time.Second)
	down := []Outage{{What: "worker", Start: start, End: end, Keys: func(key string) bool { return key == "down" }}}
	try := func(key string, at time.Time, refused bool) Attempt {
		a := Attempt{Key: key, Action: key, Method: failClosed, Attempt: 1, Try: 1, Start: at, End: at.Add(time.Second), Code: "OK", Response: []byte("r")}
		if refused {
			a.Code, a.Reason, a.Response = "Unavailable", reasonStoreUnavailable, nil
		}
		return a
	}
	var served, refused []Attempt
	for i := range 10 {
		at := start.Add(time.Duration(i) * time.Second)
		served = append(served, try("live", at, i == 0), try("down", at, true))
		refused = append(refused, try("live", at, i > 0), try("down", at, true))
	}
	late := try("down", end.Add(3*time.Second), true)
	before := try("live", start.Add(-time.Second), true)

	r := Check("served", 7, append(append(served, late, before), try("live", end.Add(5*time.Second), false)), nil, 0, down, nil, Rules{})
	r.RequireSpared(0.9, 10)
	if r.SparedTries != 10 || r.SparedRefused != 1 || r.RefusedAfterOutage != 4*time.Second || slicesContain(r.Violations, "spared") {
		t.Errorf("9 of 10 spared tries served: spared %d, refused %d, refused %s after; violations %v; want 10, 1, 4s and none from RequireSpared",
			r.SparedTries, r.SparedRefused, r.RefusedAfterOutage, r.Violations)
	}
	r = Check("refused", 7, refused, nil, 0, down, nil, Rules{})
	r.RequireSpared(0.9, 10)
	if !slicesContain(r.Violations, "spared were answered") {
		t.Errorf("9 of 10 spared tries refused: violations %v, want one from RequireSpared", r.Violations)
	}
	r = Check("untested", 7, refused, nil, 0, down, nil, Rules{})
	r.RequireSpared(0.9, 11)
	if !slicesContain(r.Violations, "did not test them") {
		t.Errorf("10 spared tries where 11 are wanted: violations %v, want the run called untested", r.Violations)
	}
}

// slicesContain reports whether some violation contains part.
func slicesContain(violations []string, part string) bool {
	for _, v := range violations {
		if strings.Contains(v, part) {
			return true
		}
	}
	return false
}

// TestRequireRecovered holds a restarted node to serving its keys again
// within a bound (issue 38 item 3): tries that started after the outage
// ended and were refused as unavailable, or given up while no handler of
// their key started, count; a try given up while its handler ran (a pause)
// does not, nor does one on a key the outage spared.
func TestRequireRecovered(t *testing.T) {
	t.Parallel()
	start, end := t0.Add(10*time.Second), t0.Add(20*time.Second)
	down := []Outage{{What: "worker", Start: start, End: end, Keys: func(key string) bool { return key != "spared" }}}
	try := func(key string, at time.Time, code, reason string) Attempt {
		a := Attempt{Key: key, Action: key, Method: failClosed, Attempt: 1, Try: 1, Start: at, End: at.Add(time.Second), Code: code, Reason: reason}
		if code == "OK" {
			a.Response = []byte("r")
		}
		return a
	}
	history := []Attempt{
		try("refused", end.Add(time.Second), "Unavailable", reasonStoreUnavailable),
		try("gave-up", end.Add(4*time.Second), "DeadlineExceeded", ""),
		try("paused", end.Add(20*time.Second), "DeadlineExceeded", ""),
		try("spared", end.Add(30*time.Second), "Unavailable", reasonStoreUnavailable),
		try("during", start.Add(time.Second), "Unavailable", reasonStoreUnavailable),
		try("served", end.Add(40*time.Second), "OK", ""),
	}
	ledger := []LedgerEntry{{Key: "paused", Event: EventStart, Time: end.Add(20*time.Second + time.Millisecond)}}

	r := Check("recovered", 7, history, ledger, 0, down, nil, Rules{})
	r.RequireRecovered(10 * time.Second)
	if r.UnservedAfter != 2 || r.UnservedAfterOutage != 5*time.Second || slicesContain(r.Violations, "want of the store") {
		t.Errorf("unserved %d, the last %s after the outage, violations %v; want 2, 5s and none from RequireRecovered",
			r.UnservedAfter, r.UnservedAfterOutage, r.Violations)
	}
	r = Check("slow", 7, history, ledger, 0, down, nil, Rules{})
	r.RequireRecovered(4 * time.Second)
	if !slicesContain(r.Violations, "want none past 4s") {
		t.Errorf("the last unserved try 5s after the outage, 4s allowed: violations %v, want one from RequireRecovered", r.Violations)
	}
	r = Check("untested", 7, history, ledger, 0, nil, nil, Rules{})
	r.RequireRecovered(10 * time.Second)
	if !slicesContain(r.Violations, "no outage recorded") {
		t.Errorf("no outage: violations %v, want the run called untested", r.Violations)
	}
}

package chaos

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
)

// reasonOutcomeUnknown is idemgate.ReasonOutcomeUnknown, spelled out so
// the checker judges the wire, not the library's constant.
const reasonOutcomeUnknown = "IDEMPOTENCY_OUTCOME_UNKNOWN"

// The gates' refusals that show a fault reached the callers, spelled out as
// reasonOutcomeUnknown is: the store away (a Begin that could not be
// answered), and a duplicate that waited max_wait for a live holder.
const (
	reasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	reasonInFlight         = "IDEMPOTENCY_IN_FLIGHT"
)

// Outage is a window in which the scenario held the store away: no Begin can
// be answered in it, so no handler may start in it.
type Outage struct {
	// What names the fault, for the report.
	What string
	// Servers names the tool servers the store was away from; empty means
	// every one.
	Servers []string
	// Start is when the store was certainly gone; End when it was brought
	// back (it may answer only later).
	Start, End time.Time
	// Keys, when set, says which keys the store was away for (those on a
	// Citus worker that was down); nil means every key.
	Keys func(key string) bool
}

// HolderFault is a tool server the suite killed (Start equals End) or
// stopped (Start to End). A Begin it had sent then may have reserved a key
// whose handler never started: the process died or stood still between the
// reservation and the handler's first ledger line, and nothing can tell the
// store so, so a FAIL_CLOSED record goes outcome-unknown with no handler run.
type HolderFault struct {
	// What names the fault, for the report.
	What string
	// Targets are the addresses the workload reaches the tool server at.
	Targets    []string
	Start, End time.Time
}

// hit reports whether a try of a, at its target, spanned the fault.
func (h HolderFault) hit(a Attempt) bool {
	return slices.Contains(h.Targets, a.Target) && !a.Start.After(h.End) && !a.End.Before(h.Start)
}

func (o Outage) covers(server string) bool {
	return len(o.Servers) == 0 || slices.Contains(o.Servers, server)
}

func (o Outage) coversKey(key string) bool {
	return o.Keys == nil || o.Keys(key)
}

// Rules say what a scenario's faults make legitimate, per docs/failure-semantics.md's
// "When something fails mid-call". All default to false: the strict rules.
type Rules struct {
	// RerunAllowed: a holder is killed, stalled or cut off past its lease,
	// so a REEXECUTE action may run again. A fenced holder's caller gets
	// IDEMPOTENCY_IN_FLIGHT, not its own response, so this alone allows no
	// caller a response other than the stored one.
	RerunAllowed bool
	// HolderCutOff: a holder may be cut off from the store (a recorded
	// outage for its tool server). Its caller is still answered only with
	// an outcome the store took (docs/failure-semantics.md), so callers of
	// one action never get two different OKs under any rule. But a Begin
	// that reserved the key but whose answer was cut off holds the key,
	// unknowingly, until its lease runs out: a FAIL_CLOSED duplicate then
	// gets outcome-unknown for an action no handler ran, until the
	// attempt's re-sent Begin takes the record back. That is allowed for an
	// action with a try that overlapped an outage. And without
	// HolderFaults, an outcome-unknown answer for an action whose handler
	// ran is allowed only where a run's tool server was cut off after the
	// run started and before the answer (its lease ran out unrenewed),
	// counted in Report.UnknownsAfterCutOff.
	HolderCutOff bool
	// CutOffRerunAllowed: a REEXECUTE action may run again where the
	// earlier run's tool server was cut off from the store (a recorded
	// outage for it) when the re-run started: its lease ran out unrenewed.
	// Counted in Report.RerunsAfterCutOff; any other re-run is a violation
	// unless RerunAllowed or a handler error allows it.
	CutOffRerunAllowed bool
	// HolderFaults: a holder may die or stall, so an outcome-unknown answer
	// is legitimate for any action whose handler started, and for one no
	// handler ran whose try was at a tool server when it was killed or
	// stopped (HolderFault): its Begin may have reserved the key just
	// before. Without it, an
	// outcome-unknown answer for an action whose every run ended cleanly is a
	// false unknown: a store outage must cost the holder nothing.
	HolderFaults bool
}

// outageStartMargin is left out at the start of each outage window: a Begin
// answered just before the fault may reach its handler a moment later on a
// starved scheduler.
const outageStartMargin = 2 * time.Second

// Report is the checker's verdict on one scenario.
type Report struct {
	// Scenario names it; Seed reproduces it.
	Scenario string
	Seed     uint64
	// Actions, Attempts and Executions count the history's actions and
	// tries and the ledger's side effects.
	Actions, Attempts, Executions int
	// OK counts successful tries, Replayed those that were replays, Unknown
	// the IDEMPOTENCY_OUTCOME_UNKNOWN answers; Unsettled the actions no
	// caller got an OK for.
	OK, Replayed, Unknown, Unsettled int
	// Violations of the guarantees, each counted per action.
	Duplicates, LostOutcomes, Phantoms, NonIdentical, FalseUnknowns, ExecutionsDuringOutage int
	// UnknownsAtHolderFault counts the actions answered outcome-unknown with
	// no handler run whose try was at a tool server when it was killed or
	// stopped (allowed under Rules.HolderFaults).
	UnknownsAtHolderFault int
	// Reruns counts REEXECUTE re-runs, allowed only under Rules.RerunAllowed,
	// after a handler error, or (RerunsAfterCutOff, also counted in Reruns)
	// under Rules.CutOffRerunAllowed where the earlier run's tool server was
	// cut off; violations otherwise. UnkeptAnswers counts the REEXECUTE
	// actions whose callers got two different OK responses: at least one of
	// them names an execution the key never keeps (replays). Never allowed;
	// a FAIL_CLOSED action's are counted in NonIdentical.
	Reruns, RerunsAfterCutOff, UnkeptAnswers int
	// UnknownsAfterCutOff counts the actions answered outcome-unknown whose
	// handler ran on a tool server cut off from the store after the run
	// started and before the answer (allowed under Rules.HolderCutOff).
	UnknownsAfterCutOff int
	// AttemptsDuringOutage counts tries that overlapped an outage (not a
	// violation); TornLedgerLines the ledger lines cut short by a SIGKILL.
	AttemptsDuringOutage, TornLedgerLines int
	// SparedTries counts the tries that started during an outage of some
	// keys only (Outage.Keys: a Citus worker down) on a key it spared;
	// SparedRefused those of them answered IDEMPOTENCY_STORE_UNAVAILABLE
	// (RequireSpared).
	SparedTries, SparedRefused int
	// RefusedAfterOutage is how long after an outage of some keys ended (a
	// Citus worker started again) the last try on its keys answered
	// IDEMPOTENCY_STORE_UNAVAILABLE ended: how long the service took to
	// serve them again, as the callers saw it (0: none after the end).
	RefusedAfterOutage time.Duration
	// UnservedAfterOutage is how long after an outage ended (the node or
	// database started again) the last try on its keys that started after
	// that end failed for want of the store ended: answered
	// IDEMPOTENCY_STORE_UNAVAILABLE, or DeadlineExceeded, Canceled or
	// Unavailable with no gate reason while no handler of its key started
	// (issue 38 item 3: calls succeed again within 10s of a restart;
	// RequireRecovered). 0 when every such try was served.
	UnservedAfterOutage time.Duration
	// UnservedAfter counts those tries; LastUnserved describes the latest
	// few, for the report.
	UnservedAfter int
	LastUnserved  []string
	// recoveryChecked says RequireRecovered ran, so the report shows the
	// unserved tries: elsewhere a duplicate's wait for a paused holder
	// counts among them, which would read as the store's.
	recoveryChecked bool
	// LateMetadataActions counts the actions whose handler set its metadata
	// only after its caller gave up (LateMetadataSuffix), GaveUp their
	// callers' first tries given up, LateMetadataRuns the runs that set it
	// with the caller gone, MissingMetadata (a violation) those actions
	// with an OK answer that lacks it (latemeta.go).
	LateMetadataActions, GaveUp, LateMetadataRuns, MissingMetadata int
	// Reasons counts the tries answered with each gate reason (the
	// ErrorInfo's, or the problem's over HTTP), whatever the transport.
	Reasons map[string]int
	// Rules are the rules applied.
	Rules Rules
	// Violations describes each violation, one line each.
	Violations []string
	// outages are the windows Check was given.
	outages []Outage
}

// Failed reports whether any guarantee was violated.
func (r *Report) Failed() bool { return len(r.Violations) > 0 }

// String prints the report as the suite logs it.
func (r *Report) String() string {
	var b strings.Builder
	verdict := "PASS"
	if r.Failed() {
		verdict = fmt.Sprintf("FAIL (%d violations)", len(r.Violations))
	}
	allowed := func(ok bool, why, otherwise string) string {
		if ok {
			return "allowed: " + why
		}
		return otherwise
	}
	fmt.Fprintf(&b, "scenario %s (seed %d): %s\n", r.Scenario, r.Seed, verdict)
	fmt.Fprintf(&b, "  actions %d, attempts %d, executions %d, ok %d (replayed %d), outcome-unknown answers %d (%d actions no handler ran, tried as a tool server was killed or stopped), actions never ok %d\n",
		r.Actions, r.Attempts, r.Executions, r.OK, r.Replayed, r.Unknown, r.UnknownsAtHolderFault, r.Unsettled)
	fmt.Fprintf(&b, "  duplicates %d, lost outcomes %d, phantom responses %d, non-identical replays %d, false unknowns %d, executions while the store was away %d\n",
		r.Duplicates, r.LostOutcomes, r.Phantoms, r.NonIdentical, r.FalseUnknowns, r.ExecutionsDuringOutage)
	reruns := allowed(r.Rules.RerunAllowed, "holder faults", "allowed only after a handler error")
	if r.Rules.CutOffRerunAllowed {
		reruns = fmt.Sprintf("%d after the holder was cut off past its lease, allowed; others only after a handler error", r.RerunsAfterCutOff)
	}
	fmt.Fprintf(&b, "  REEXECUTE re-runs %d (%s), answers the key never keeps %d (never allowed), attempts while the store was away %d, torn ledger lines %d\n",
		r.Reruns, reruns, r.UnkeptAnswers, r.AttemptsDuringOutage, r.TornLedgerLines)
	if r.Rules.HolderCutOff && !r.Rules.HolderFaults {
		fmt.Fprintf(&b, "  outcome-unknown answers for a holder cut off past its lease %d (allowed)\n", r.UnknownsAfterCutOff)
	}
	fmt.Fprintf(&b, "  answers %s %d, %s %d\n", reasonStoreUnavailable, r.Reasons[reasonStoreUnavailable], reasonInFlight, r.Reasons[reasonInFlight])
	if r.SparedTries > 0 {
		fmt.Fprintf(&b, "  tries on keys a partial outage spared %d, answered %s %d; its own keys' last %s ended %s after it\n",
			r.SparedTries, reasonStoreUnavailable, r.SparedRefused, reasonStoreUnavailable, r.RefusedAfterOutage.Round(time.Millisecond))
	}
	if r.recoveryChecked {
		fmt.Fprintf(&b, "  tries started after an outage ended that failed for want of the store %d, the last ending %s after it\n",
			r.UnservedAfter, r.UnservedAfterOutage.Round(time.Millisecond))
		last := r.LastUnserved
		if len(last) > shownUnserved {
			last = last[len(last)-shownUnserved:]
		}
		for _, u := range last {
			fmt.Fprintf(&b, "    unserved: %s\n", u)
		}
	}
	b.WriteString(r.metadataLine())
	const shown = 20
	for i, v := range r.Violations {
		if i == shown {
			fmt.Fprintf(&b, "  ... and %d more\n", len(r.Violations)-shown)
			break
		}
		fmt.Fprintf(&b, "  VIOLATION %s\n", v)
	}
	return b.String()
}

// actionFacts is what the history and the ledger say about one key.
type actionFacts struct {
	reexecute bool
	// triedDuringOutage: a try of the action overlapped an outage window.
	triedDuringOutage bool
	// triedAtHolderFault: a try of the action was at a tool server when it
	// was killed or stopped.
	triedAtHolderFault bool
	attempts           []Attempt
	starts             []LedgerEntry
	effects            []LedgerEntry
	ends               []LedgerEntry
}

// Check judges one scenario's history against its ledger.
func Check(scenario string, seed uint64, history []Attempt, ledger []LedgerEntry, torn int, outages []Outage, holders []HolderFault, rules Rules) *Report {
	r := &Report{Scenario: scenario, Seed: seed, Attempts: len(history), TornLedgerLines: torn, Rules: rules, Reasons: map[string]int{}, outages: outages}
	facts := map[string]*actionFacts{}
	get := func(key string) *actionFacts {
		f, ok := facts[key]
		if !ok {
			f = &actionFacts{}
			facts[key] = f
		}
		return f
	}
	for _, a := range history {
		f := get(a.Key)
		f.attempts = append(f.attempts, a)
		f.reexecute = a.Method == testingv1.ChaosService_ChargeReexecute_FullMethodName
		if a.Reason != "" {
			r.Reasons[a.Reason]++
		}
		for _, o := range outages {
			if o.coversKey(a.Key) && a.Start.Before(o.End) && a.End.After(o.Start) {
				r.AttemptsDuringOutage++
				f.triedDuringOutage = true
				break
			}
		}
		for _, o := range outages {
			if o.Keys != nil && o.Keys(a.Key) && a.Reason == reasonStoreUnavailable && a.End.After(o.End) {
				r.RefusedAfterOutage = max(r.RefusedAfterOutage, a.End.Sub(o.End))
			}
		}
		for _, o := range outages {
			if o.Keys != nil && !o.Keys(a.Key) && !a.Start.Before(o.Start) && a.Start.Before(o.End) {
				r.SparedTries++
				if a.Reason == reasonStoreUnavailable {
					r.SparedRefused++
				}
				break
			}
		}
		for _, h := range holders {
			if h.hit(a) {
				f.triedAtHolderFault = true
				break
			}
		}
	}
	for _, e := range ledger {
		f := get(e.Key)
		switch e.Event {
		case EventStart:
			f.starts = append(f.starts, e)
			for _, o := range outages {
				if o.covers(e.Server) && o.coversKey(e.Key) && e.Time.After(o.Start.Add(outageStartMargin)) && e.Time.Before(o.End) {
					r.ExecutionsDuringOutage++
					r.violate("%s: a handler started on %s at %s, while the store was away (%s, %s to %s)",
						e.Key, e.Server, e.Time.Format(time.StampMilli), o.What, o.Start.Format(time.StampMilli), o.End.Format(time.StampMilli))
				}
			}
		case EventEffect:
			f.effects = append(f.effects, e)
			if e.Method == testingv1.ChaosService_ChargeReexecute_FullMethodName {
				f.reexecute = true
			}
		case EventEnd:
			f.ends = append(f.ends, e)
		}
	}
	keys := make([]string, 0, len(facts))
	for k, f := range facts {
		if len(f.attempts) > 0 {
			r.Actions++
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		r.checkAction(key, facts[key])
	}
	r.checkMetadataCoverage()
	r.measureRecovery(history, facts, outages)
	return r
}

// measureRecovery sets UnservedAfterOutage and UnservedAfter.
func (r *Report) measureRecovery(history []Attempt, facts map[string]*actionFacts, outages []Outage) {
	history = slices.Clone(history)
	slices.SortStableFunc(history, func(a, b Attempt) int { return a.End.Compare(b.End) })
	for _, a := range history {
		for _, o := range outages {
			if !o.coversKey(a.Key) || a.Start.Before(o.End) || !unserved(a, facts[a.Key]) {
				continue
			}
			r.UnservedAfter++
			r.UnservedAfterOutage = max(r.UnservedAfterOutage, a.End.Sub(o.End))
			r.LastUnserved = append(r.LastUnserved, fmt.Sprintf("%s try %d.%d at %s: %s %s, %s to %s after the outage",
				a.Key, a.Attempt, a.Try, a.Target, a.Code, a.Reason, a.Start.Sub(o.End).Round(time.Millisecond), a.End.Sub(o.End).Round(time.Millisecond)))
			break
		}
	}
}

// shownUnserved is how many of the unserved tries the report describes.
const shownUnserved = 5

// unserved reports whether a failed for want of the store: refused as
// unavailable, or given up (by its caller's deadline or the connection)
// while no handler of its key started.
func unserved(a Attempt, f *actionFacts) bool {
	if a.Reason == reasonStoreUnavailable {
		return true
	}
	if a.Reason != "" || (a.Code != codes.DeadlineExceeded.String() && a.Code != codes.Canceled.String() && a.Code != codes.Unavailable.String()) {
		return false
	}
	for _, e := range f.starts {
		if !e.Time.Before(a.Start) && !e.Time.After(a.End) {
			return false
		}
	}
	return true
}

// RequireRecovered checks that the store served every try on an outage's
// keys that started more than within after the outage ended (issue 38
// item 3), and that some tries started after an outage, or the run did not
// test the recovery.
func (r *Report) RequireRecovered(within time.Duration) {
	r.recoveryChecked = true
	if len(r.outages) == 0 {
		r.violate("no outage recorded: the run did not test the recovery")
		return
	}
	if r.UnservedAfterOutage > within {
		r.violate("%d tries started after an outage ended failed for want of the store, the last ending %s after it; want none past %s",
			r.UnservedAfter, r.UnservedAfterOutage.Round(time.Millisecond), within)
	}
}

// RequireReasons fails a run none of whose callers was answered with one
// of reasons: the scenario's fault never reached them, so the run tested
// nothing of it (a fault skipped, or a path the transport never takes).
func (r *Report) RequireReasons(reasons ...string) {
	for _, reason := range reasons {
		if r.Reasons[reason] == 0 {
			r.violate("no caller was answered %s: the fault never reached the callers, so the run did not test it", reason)
		}
	}
}

// RequireSpared checks that an outage of some keys only (a Citus worker
// down) did not stop the others: at least least tries started on the keys
// it spared while it lasted, and at most 1 - share of them were answered
// IDEMPOTENCY_STORE_UNAVAILABLE.
func (r *Report) RequireSpared(share float64, least int) {
	switch {
	case r.SparedTries < least:
		r.violate("%d tries started on keys the outage spared while it lasted, fewer than %d: the run did not test them", r.SparedTries, least)
	case float64(r.SparedTries-r.SparedRefused) < share*float64(r.SparedTries):
		r.violate("%d of %d tries on keys the outage spared were answered %s while it lasted; want at most %.0f%%",
			r.SparedRefused, r.SparedTries, reasonStoreUnavailable, 100*(1-share))
	}
}

func (r *Report) violate(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

func (r *Report) checkAction(key string, f *actionFacts) {
	r.Executions += len(f.effects)
	if n := len(f.effects); n > 1 {
		servers := make([]string, n)
		for i, e := range f.effects {
			servers[i] = fmt.Sprintf("%s epoch %d at %s", e.Server, e.Epoch, e.Time.Format(time.StampMilli))
		}
		switch {
		case !f.reexecute:
			r.Duplicates++
			r.violate("%s: FAIL_CLOSED action executed %d times: %s", key, n, strings.Join(servers, "; "))
		case r.Rules.RerunAllowed || endedInError(f.ends):
			// A holder fault, or a run that ended in an error, which
			// REEXECUTE releases for a re-run.
			r.Reruns += n - 1
		case r.Rules.CutOffRerunAllowed && r.rerunsAfterCutOff(f.effects):
			r.Reruns += n - 1
			r.RerunsAfterCutOff += n - 1
		default:
			r.Reruns += n - 1
			r.violate("%s: REEXECUTE action re-run %d times with no holder fault to allow it: %s", key, n-1, strings.Join(servers, "; "))
		}
	}
	var okBodies, replayBodies [][]byte
	gotOK, phantom, lost := false, false, false
	for _, a := range f.attempts {
		if a.Reason == reasonOutcomeUnknown {
			r.Unknown++
		}
		if a.Code != "OK" {
			continue
		}
		r.OK++
		gotOK = true
		if a.Replayed {
			r.Replayed++
			replayBodies = appendDistinct(replayBodies, a.Response)
		}
		okBodies = appendDistinct(okBodies, a.Response)
		switch {
		case len(f.effects) == 0:
			if !lost {
				r.LostOutcomes++
				r.violate("%s: caller %d got OK (attempt %d, try %d) but no execution is in the ledger", key, a.Caller, a.Attempt, a.Try)
			}
			lost = true
		case !matchesEffect(a.Response, f.effects):
			if !phantom {
				r.Phantoms++
				r.violate("%s: caller %d got an OK (attempt %d, try %d, replayed %t) whose bytes match no execution", key, a.Caller, a.Attempt, a.Try, a.Replayed)
			}
			phantom = true
		}
	}
	if !gotOK && len(f.attempts) > 0 {
		r.Unsettled++
	}
	switch {
	case len(replayBodies) > 1 || len(okBodies) > 1 && !f.reexecute:
		r.NonIdentical++
		r.violate("%s: callers got %d different OK responses (%d different replays)", key, len(okBodies), len(replayBodies))
	case len(okBodies) > 1:
		r.UnkeptAnswers++
		kept := "no replay seen"
		if len(replayBodies) == 1 {
			kept = fmt.Sprintf("it replays %q", replayBodies[0])
		}
		r.violate("%s: REEXECUTE callers got %d different OK responses, so a caller was answered with an outcome the key never keeps (%s)", key, len(okBodies), kept)
	}
	r.checkUnknowns(key, f)
	r.checkMetadata(key, f)
}

// checkUnknowns finds outcome-unknown answers the faults cannot explain.
func (r *Report) checkUnknowns(key string, f *actionFacts) {
	var unknown *Attempt
	for i := range f.attempts {
		if f.attempts[i].Reason == reasonOutcomeUnknown {
			unknown = &f.attempts[i]
			break
		}
	}
	if unknown == nil {
		return
	}
	if len(f.starts) == 0 {
		if r.Rules.HolderCutOff && f.triedDuringOutage {
			return
		}
		if r.Rules.HolderFaults && f.triedAtHolderFault {
			r.UnknownsAtHolderFault++
			return
		}
		r.FalseUnknowns++
		r.violate("%s: caller %d got %s (attempt %d) but no handler ever ran for it", key, unknown.Caller, reasonOutcomeUnknown, unknown.Attempt)
		return
	}
	if r.Rules.HolderFaults {
		return
	}
	if r.Rules.HolderCutOff && r.cutOffWhileHolding(f.starts, unknown.End) {
		r.UnknownsAfterCutOff++
		return
	}
	if len(f.ends) == len(f.starts) && !endedInError(f.ends) {
		r.FalseUnknowns++
		r.violate("%s: caller %d got %s (attempt %d) though every run of it ended cleanly and no holder was harmed", key, unknown.Caller, reasonOutcomeUnknown, unknown.Attempt)
	}
}

// cutOffMargin is how long after a cut-off ends a takeover still counts
// as caused by it: the taker's Begin may have been decided just before
// the heal and its handler started a moment later on a starved scheduler.
const cutOffMargin = 2 * time.Second

// cutOff reports whether server was cut off from the store (a recorded
// outage for it, not one of every server) at some time in [from, to], the
// outage's end stretched by cutOffMargin.
func (r *Report) cutOff(server string, from, to time.Time) bool {
	for _, o := range r.outages {
		if len(o.Servers) > 0 && o.covers(server) && !o.Start.After(to) && o.End.Add(cutOffMargin).After(from) {
			return true
		}
	}
	return false
}

// rerunsAfterCutOff reports whether every re-run in effects (in ledger
// order, by time) started while an earlier run's tool server was cut off
// from the store, after that run started: the earlier holder's lease ran
// out unrenewed, which is what lets REEXECUTE take it over.
func (r *Report) rerunsAfterCutOff(effects []LedgerEntry) bool {
	runs := slices.Clone(effects)
	slices.SortFunc(runs, func(a, b LedgerEntry) int { return a.Time.Compare(b.Time) })
	for i := 1; i < len(runs); i++ {
		ok := false
		for _, earlier := range runs[:i] {
			if r.cutOff(earlier.Server, runs[i].Time, runs[i].Time) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// cutOffWhileHolding reports whether a run in starts was on a tool server
// that was cut off from the store after the run started and before until
// (an outcome-unknown answer's end).
func (r *Report) cutOffWhileHolding(starts []LedgerEntry, until time.Time) bool {
	for _, s := range starts {
		if r.cutOff(s.Server, s.Time, until) {
			return true
		}
	}
	return false
}

func endedInError(ends []LedgerEntry) bool {
	for _, e := range ends {
		if e.Error != "" {
			return true
		}
	}
	return false
}

func matchesEffect(body []byte, effects []LedgerEntry) bool {
	for _, e := range effects {
		if bytes.Equal(body, e.Response) {
			return true
		}
	}
	return false
}

func appendDistinct(set [][]byte, b []byte) [][]byte {
	for _, s := range set {
		if bytes.Equal(s, b) {
			return set
		}
	}
	return append(set, b)
}

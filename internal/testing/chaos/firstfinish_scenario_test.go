package chaos

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// firstFinishCutOff is how long a tool server whose holder's first Finish
// was dropped is cut off from the Dedupe service: past the lease, as in
// issue 31 item 1's run.
const firstFinishCutOff = lease + 3*time.Second

// firstFinishWorkload is one action at a time, each on the other tool
// server than the last, 9s apart: its first caller alone (the holder), the
// others lease + 1.5s later, after the holder's lease ran out unrenewed
// and while it is still cut off: one through the other tool server, one
// through the holder's. The next holder's cut-off starts after those
// duplicates reached the other tool server.
func firstFinishWorkload(reexecute float64) Workload {
	return Workload{Reexecute: reexecute, Actions: 3, Spread: 27 * time.Second, DuplicatesAfter: lease + 1500*time.Millisecond}
}

// droppedFinishes is the directory of a scenario's DropClaims.
func (st *Stack) droppedFinishes() string { return filepath.Join(st.dir, "dropped-finishes") }

// dropFirstFinishes makes every tool server drop the first Finish of each
// key (chaos-tool -drop-first-finish) behind a proxy to the Dedupe service.
func dropFirstFinishes(st *Stack) {
	if err := os.MkdirAll(st.droppedFinishes(), 0o755); err != nil {
		st.T().Fatal(err)
	}
	proxyDedupe(st)
	for _, tool := range st.Tools {
		tool.ToolArgs = append(tool.ToolArgs, "-drop-first-finish", st.droppedFinishes())
	}
}

// cutOffAfterDroppedFinish watches for the tool servers' DropClaims and cuts
// each claimer off from the Dedupe service (a blackhole on its proxy)
// for firstFinishCutOff, then acknowledges the claim, so the dropped Finish
// fails only once its holder is cut off and the gate cannot retry it in
// between. A claim on a tool server already cut off is acknowledged at
// once. Each cut-off is recorded as an outage of that tool server. It fails
// the scenario when no Finish was dropped: the run tested nothing.
func cutOffAfterDroppedFinish(st *Stack, done <-chan struct{}) error {
	dir := st.droppedFinishes()
	type cut struct{ start, until time.Time }
	cuts := map[*Member]*cut{}
	seen := map[string]bool{}
	dropped := 0
	heal := func(m *Member, c *cut) {
		m.DedupeProxy.Heal()
		st.outage(fmt.Sprintf("%s cut off from Dedupe after a dropped first Finish", m.Name), c.start, time.Now(), m.Name)
		st.T().Logf("%s: reconnected to Dedupe after %s", m.Name, time.Since(c.start).Round(time.Millisecond))
		delete(cuts, m)
	}
	for {
		finished := false
		select {
		case <-done:
			finished = true
		case <-st.ctx.Done():
			return errors.New("interrupted")
		case <-time.After(10 * time.Millisecond):
		}
		for m, c := range cuts {
			if !time.Now().Before(c.until) {
				heal(m, c)
			}
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			name := e.Name()
			if strings.HasPrefix(name, ".") || strings.HasSuffix(name, DropAckSuffix) || seen[name] {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				return err
			}
			var claim DropClaim
			if err := json.Unmarshal(b, &claim); err != nil {
				return fmt.Errorf("claim %s: %w", name, err)
			}
			var m *Member
			for _, tool := range st.Tools {
				if tool.Name == claim.Server {
					m = tool
				}
			}
			if m == nil {
				return fmt.Errorf("claim %s names no tool server: %q", name, claim.Server)
			}
			seen[name] = true
			dropped++
			if cuts[m] == nil {
				m.DedupeProxy.Blackhole()
				now := time.Now()
				cuts[m] = &cut{start: now, until: now.Add(firstFinishCutOff)}
				st.T().Logf("%s: the first Finish of %s dropped; cut off from Dedupe for %s", m.Name, claim.Key, firstFinishCutOff)
			} else {
				st.T().Logf("%s: the first Finish of %s dropped while it is cut off", m.Name, claim.Key)
			}
			if err := os.WriteFile(filepath.Join(dir, name+DropAckSuffix), nil, 0o644); err != nil {
				return err
			}
		}
		if finished {
			for m, c := range cuts {
				heal(m, c)
			}
			if dropped == 0 {
				return errors.New("no first Finish was dropped: the run tested nothing")
			}
			st.T().Logf("%d first Finishes dropped", dropped)
			return nil
		}
	}
}

// firstFinishLostScenarios are issue 31 item 1, once per policy: two tool
// servers behind one Dedupe service on PostgreSQL; each holder's first
// Finish is dropped (the store never sees it) about 200ms after its Begin,
// then its tool server is cut off from the Dedupe service for the lease +
// 3s while the other still reaches it; duplicates arrive through both
// after the lease. No caller may be answered with an outcome the key never
// keeps; a REEXECUTE re-run is allowed only after its holder was cut off
// (its lease ran out unrenewed), a FAIL_CLOSED outcome-unknown answer only
// while its holder was. Callers through the cut-off tool server need not see
// IDEMPOTENCY_STORE_UNAVAILABLE (a Begin may wait out the cut-off and be
// answered), so the scenario requires no reason; it fails instead when no
// Finish was dropped.
func firstFinishLostScenarios() []Scenario {
	var list []Scenario
	for _, p := range []struct {
		name      string
		reexecute float64
	}{{"reexecute", 1}, {"fail-closed", 0}} {
		list = append(list, Scenario{Name: StorePostgres + "/first-finish-lost-" + p.name, Store: StorePostgres, Tools: 2,
			Workload: firstFinishWorkload(p.reexecute), Setup: dropFirstFinishes, Background: cutOffAfterDroppedFinish,
			Rules: Rules{HolderCutOff: true, CutOffRerunAllowed: true}})
	}
	return list
}

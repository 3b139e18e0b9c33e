package incident_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/incident"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// The demo's result must not depend on how fast the machine is: a replay
// whose every call is delayed, as on a starved 2-core machine, prints the
// same table as one that is not. (On PostgreSQL: the embedded store is slow
// under the race detector, and the result does not depend on the store.)
func TestReplayIndependentOfMachineSpeed(t *testing.T) {
	t.Parallel()
	run := func(stall time.Duration) incident.Report {
		cfg := incident.Config{DatabaseURL: pgtest.SchemaURL(t), Orders: 24, SlowRate: 0.15, LostRate: 0.15, ReemitRate: 0.2}
		incident.Stall(&cfg, stall)
		r, err := incident.Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	fast, slow := run(0), run(250*time.Millisecond)
	if fast.Table() != slow.Table() {
		t.Errorf("a starved machine changed the result:\n%s\nwant, as on an idle one:\n%s", slow.Table(), fast.Table())
	}
	if slow.Gated.Duplicates != 0 || slow.Gated.Executed != int64(slow.Gated.Actions) {
		t.Errorf("on a starved machine, with idemgate: %d side effects (%d duplicates) for %d actions, want each action once",
			slow.Gated.Executed, slow.Gated.Duplicates, slow.Gated.Actions)
	}
}

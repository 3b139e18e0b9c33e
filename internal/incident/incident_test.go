package incident_test

import (
	"context"
	"testing"

	"github.com/idemgate/idemgate/internal/incident"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

func TestReplayInvariants(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]incident.Config{
		"embedded store": {DataDir: t.TempDir()},
		"postgres":       {DatabaseURL: pgtest.SchemaURL(t)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// Rates high enough that 40 orders meet every retry source.
			cfg.Orders, cfg.SlowRate, cfg.LostRate, cfg.ReemitRate = 40, 0.15, 0.15, 0.2
			r, err := incident.Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Log("\n" + r.Table())
			if r.Ungated.Duplicates == 0 {
				t.Error("without idemgate the retries caused no duplicate: the workload does not exercise them")
			}
			if r.Gated.Duplicates != 0 {
				t.Errorf("with idemgate and orchestration keys: %d duplicate side effects, want none", r.Gated.Duplicates)
			}
			if r.Gated.Replays == 0 || r.Gated.Calls <= int64(r.Gated.Actions) {
				t.Errorf("with idemgate: %d replays over %d calls; want the retries answered by replays", r.Gated.Replays, r.Gated.Calls)
			}
			if u := r.Unexplained(); len(u) > 0 {
				t.Errorf("actions neither done as promised nor reported not done: %v", u)
			}
			if r.Gated.Executed+int64(r.Gated.NotDone) < int64(r.Gated.Actions) {
				t.Errorf("with idemgate: %d side effects and %d actions not done for %d actions: some action vanished", r.Gated.Executed, r.Gated.NotDone, r.Gated.Actions)
			}
			if r.FreshKey.Duplicates == 0 {
				t.Error("a model that makes up keys caused no duplicate: the row does not show why keys come from the orchestration layer")
			}
		})
	}
}

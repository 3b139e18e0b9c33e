package incident_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/incident"
	"github.com/idemgate/idemgate/internal/pgtest"
)

func TestReplayInvariants(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]incident.Config{
		"embedded store": {DataDir: t.TempDir()},
		"postgres":       {DatabaseURL: pgtest.SchemaURL(t)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// Rates high enough that 40 orders meet every retry source, and
			// a timeout wide enough for a slow (race-detector) machine: the
			// invariants below hold whatever the timing.
			cfg.Orders, cfg.SlowRate, cfg.LostRate, cfg.ReemitRate = 40, 0.15, 0.15, 0.2
			cfg.ClientTimeout, cfg.SlowDelay = 600*time.Millisecond, 800*time.Millisecond
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
			if r.FreshKey.Duplicates == 0 {
				t.Error("a model that makes up keys caused no duplicate: the row does not show why keys come from the orchestration layer")
			}
		})
	}
}

//go:build citus

package citustest_test

import (
	"testing"

	"github.com/idemgate/idemgate/internal/testing/citustest"
)

// TestCitusClusterDistributesTheSchema: a coordinator and two workers, and
// a migrated schema whose records and usage changes have shards on both
// workers (and none on the coordinator), the small tables a copy on every
// node.
func TestCitusClusterDistributesTheSchema(t *testing.T) {
	c := citustest.New(t, 2)
	_, schema := c.Schema(t)
	got := map[string]map[int]bool{}
	for _, p := range c.Placements(t, schema) {
		var table string
		var port int
		for i := len(p) - 1; i >= 0; i-- {
			if p[i] == ':' {
				table = p[:i]
				for _, ch := range p[i+1:] {
					port = port*10 + int(ch-'0')
				}
				break
			}
		}
		if got[table] == nil {
			got[table] = map[int]bool{}
		}
		got[table][port] = true
	}
	for _, table := range []string{"idemgate_records", "idemgate_usage_changes"} {
		for _, w := range c.Workers {
			if !got[table][w.Port()] {
				t.Errorf("%s has no shard on worker %d: %v", table, w.Port(), got[table])
			}
		}
		if got[table][c.Coordinator.Port()] {
			t.Errorf("%s has a shard on the coordinator: %v", table, got[table])
		}
	}
	for _, table := range []string{"idemgate_store_state", "idemgate_namespace_usage", "idemgate_usage_compaction"} {
		if len(got[table]) != 3 {
			t.Errorf("reference table %s is on %d nodes, want 3: %v", table, len(got[table]), got[table])
		}
	}
}

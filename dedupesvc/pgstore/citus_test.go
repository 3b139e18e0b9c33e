//go:build citus

package pgstore_test

import (
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
	"github.com/idemgate/idemgate/internal/testing/citustest"
)

// TestCitusConformance runs the store's conformance suite against the
// coordinator of a Citus cluster of a coordinator and two workers, each
// test on a schema of its own distributed by migration 012, with waiting
// duplicates woken by a Listener on the coordinator.
func TestCitusConformance(t *testing.T) {
	c := citustest.New(t, 2)
	storetest.RunWithNotifier(t, func(t *testing.T) dedupesvc.Store {
		pool, schema := c.Schema(t)
		return pgstore.New(pool, pgstore.WithChannel(schema), pgstore.WithCitus())
	}, listener)
}

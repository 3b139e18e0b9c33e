package dedupesvc_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
)

// failingMarker is a store whose MarkLostOutcomes always fails, and which
// counts its DeleteExpired calls.
type failingMarker struct {
	dedupesvc.Store
	deletes int
}

var errMark = errors.New("mark failed")

func (f *failingMarker) MarkLostOutcomes(context.Context, int) (int, error) { return 0, errMark }

func (f *failingMarker) DeleteExpired(ctx context.Context, limit int) (int, []dedupesvc.RecordID, error) {
	f.deletes++
	return f.Store.DeleteExpired(ctx, limit)
}

// TestAFailingMarkDoesNotStopTheSweep: a sweep whose marking of lost
// outcomes fails still deletes expired records, and reports the mark's
// error.
func TestAFailingMarkDoesNotStopTheSweep(t *testing.T) {
	store, err := sqlitestore.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	f := &failingMarker{Store: store}
	_, err = dedupesvc.NewSweeper(f, dedupesvc.SweeperConfig{}).SweepOnce(context.Background())
	if f.deletes == 0 || !errors.Is(err, errMark) {
		t.Fatalf("SweepOnce with a failing mark: %d DeleteExpired calls, %v; want the sweep run and the mark's error", f.deletes, err)
	}
}

package sqlitestore_test

import (
	"context"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) dedupesvc.Store {
		s, err := sqlitestore.Open(context.Background(), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

func TestReopenKeepsRecordsAndMigratesOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	p := dedupesvc.BeginParams{Scope: "/a.B/C", Key: "k", Fingerprint: make([]byte, 32), AttemptToken: "t1", Lease: 1e9, Retention: 3600e9}
	res, err := s.Begin(ctx, p)
	if err != nil || res.State != dedupesvc.BeginReserved {
		t.Fatalf("Begin = %+v, %v", res, err)
	}
	if err := s.Finish(ctx, dedupesvc.FinishParams{Scope: "/a.B/C", Key: "k", AttemptToken: "t1", Epoch: res.Epoch, Outcome: dedupesvc.Outcome{TypeURL: "x/y.Z", Value: []byte("v")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = sqlitestore.Open(ctx, dir)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	p.AttemptToken = "t2"
	if res, err := s.Begin(ctx, p); err != nil || res.State != dedupesvc.BeginCompleted || string(res.Outcome.Value) != "v" {
		t.Fatalf("after reopening: %+v, %v; want the stored outcome", res, err)
	}
}

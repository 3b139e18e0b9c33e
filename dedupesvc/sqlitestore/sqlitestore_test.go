package sqlitestore_test

import (
	"bytes"
	"context"
	"database/sql"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
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

// TestWaitingDuplicateIsWokenInProcess proves the embedded store's own
// notifier: the poll interval is longer than the wait, so only a wake-up from
// Finish or Release can answer the waiting duplicate before it gives up.
func TestWaitingDuplicateIsWokenInProcess(t *testing.T) {
	t.Parallel()
	outcome := &anypb.Any{TypeUrl: "type.googleapis.com/pkg.Response", Value: []byte("charged once")}
	tests := []struct {
		name   string
		settle func(*dedupesvc.Server, *idemgatev1.BeginRequest, int64) error
		check  func(*testing.T, *idemgatev1.BeginResponse)
	}{
		{
			name: "Finish replays the outcome",
			settle: func(srv *dedupesvc.Server, req *idemgatev1.BeginRequest, epoch int64) error {
				_, err := srv.Finish(context.Background(), &idemgatev1.FinishRequest{Scope: req.GetScope(), Key: req.GetKey(), AttemptToken: req.GetAttemptToken(), Epoch: epoch, Outcome: outcome})
				return err
			},
			check: func(t *testing.T, resp *idemgatev1.BeginResponse) {
				got := resp.GetCompleted().GetOutcome()
				if got.GetTypeUrl() != outcome.GetTypeUrl() || !bytes.Equal(got.GetValue(), outcome.GetValue()) {
					t.Fatalf("the waiter got %v, want the original's outcome", resp)
				}
			},
		},
		{
			name: "Release hands the key over",
			settle: func(srv *dedupesvc.Server, req *idemgatev1.BeginRequest, epoch int64) error {
				_, err := srv.Release(context.Background(), &idemgatev1.ReleaseRequest{Scope: req.GetScope(), Key: req.GetKey(), AttemptToken: req.GetAttemptToken(), Epoch: epoch})
				return err
			},
			check: func(t *testing.T, resp *idemgatev1.BeginResponse) {
				if resp.GetReserved() == nil {
					t.Fatalf("the waiter got %v, want the reservation", resp)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, err := sqlitestore.Open(context.Background(), t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = store.Close() })
			srv := dedupesvc.NewServer(store, dedupesvc.WithNotifier(store), dedupesvc.WithPollInterval(time.Hour))

			original := &idemgatev1.BeginRequest{
				Scope: "/pkg.S/Charge", Key: "order-1", Fingerprint: make([]byte, 32), AttemptToken: "original",
				Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour),
			}
			reserved, err := srv.Begin(context.Background(), original)
			if err != nil || reserved.GetReserved() == nil {
				t.Fatalf("the original's Begin = %v, %v; want reserved", reserved, err)
			}
			duplicate := proto.CloneOf(original)
			duplicate.AttemptToken, duplicate.MaxWait = "duplicate", durationpb.New(10*time.Second)
			answered := make(chan *idemgatev1.BeginResponse, 1)
			go func() {
				resp, err := srv.Begin(context.Background(), duplicate)
				if err != nil {
					t.Errorf("the duplicate's Begin: %v", err)
				}
				answered <- resp
			}()
			for srv.WaitStats().Started == 0 {
				time.Sleep(5 * time.Millisecond)
			}
			if err := tt.settle(srv, original, reserved.GetReserved().GetEpoch()); err != nil {
				t.Fatal(err)
			}
			tt.check(t, <-answered)
			if stats := srv.WaitStats(); stats.Notified != 1 || stats.Polled != 0 {
				t.Fatalf("wait stats %+v, want one wake-up by notification and no poll", stats)
			}
		})
	}
}

// TestRowsOfThePreviousVersionKeepWorking writes a row as the version before
// migration 002 did (no lease_ms) and has it read, renewed, finished and
// replayed.
func TestRowsOfThePreviousVersionKeepWorking(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db, err := sql.Open("sqlite", "file:"+s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Now().UnixMilli()
	if _, err := db.ExecContext(ctx, `
INSERT INTO idemgate_records (scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    retention_ms, lease_expires_at, expires_at, created_at)
VALUES ('/a.B/C', 'k', ?, 'in_flight', 't1', 1, 3600000, ?, ?, ?)`, make([]byte, 32), now+3600000, now+3600000, now); err != nil {
		t.Fatal(err)
	}
	p := dedupesvc.BeginParams{Scope: "/a.B/C", Key: "k", Fingerprint: make([]byte, 32), AttemptToken: "t2", Lease: time.Hour, Retention: time.Hour, OnLostOutcome: dedupesvc.Reexecute}
	if res, err := s.Begin(ctx, p); err != nil || res.State != dedupesvc.BeginInFlight {
		t.Fatalf("Begin on an old row = %+v, %v; want in flight", res, err)
	}
	p.AttemptToken = "t1"
	if res, err := s.Begin(ctx, p); err != nil || res.State != dedupesvc.BeginReserved || res.Epoch != 1 {
		t.Fatalf("the old holder's retried Begin = %+v, %v; want reserved, epoch 1", res, err)
	}
	if _, err := s.Heartbeat(ctx, dedupesvc.HeartbeatParams{Scope: "/a.B/C", Key: "k", AttemptToken: "t1", Epoch: 1, Lease: time.Minute}); err != nil {
		t.Fatalf("Heartbeat on an old row: %v", err)
	}
	if err := s.Finish(ctx, dedupesvc.FinishParams{Scope: "/a.B/C", Key: "k", AttemptToken: "t1", Epoch: 1, Outcome: dedupesvc.Outcome{TypeURL: "x/y.Z", Value: []byte("v")}}); err != nil {
		t.Fatalf("Finish on an old row: %v", err)
	}
	p.AttemptToken = "t3"
	if res, err := s.Begin(ctx, p); err != nil || res.State != dedupesvc.BeginCompleted || string(res.Outcome.Value) != "v" {
		t.Fatalf("replay of an old row = %+v, %v", res, err)
	}
}

package dedupesvc_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// A duplicate waiting (max_wait) on an in-flight key is woken by the
// Finish of the attempt that took the key over (REEXECUTE) after the first
// holder's lease ran out, not left to poll: the poll interval here is an
// hour, so only a notification answers it before its max_wait.
func TestAWaiterIsWokenByTheFinishOfAHolderThatTookTheKeyOver(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for name, open := range map[string]func(t *testing.T) (dedupesvc.Store, dedupesvc.Notifier, func(key string) bool){
		"postgres": func(t *testing.T) (dedupesvc.Store, dedupesvc.Notifier, func(string) bool) {
			pool, schema := pgtest.Schema(t)
			l := pgstore.NewListener(pool, schema, quiet)
			runCtx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); l.Run(runCtx) }()
			t.Cleanup(func() { cancel(); <-done })
			// The waiter's watcher has asked for a notification once the
			// record is flagged as waited for.
			subscribed := func(key string) bool {
				var waiters bool
				err := pool.QueryRow(context.Background(), "SELECT waiters FROM idemgate_records WHERE idempotency_key = $1", key).Scan(&waiters)
				return err == nil && waiters
			}
			return pgstore.New(pool, pgstore.WithChannel(schema)), l, subscribed
		},
		"embedded": func(t *testing.T) (dedupesvc.Store, dedupesvc.Notifier, func(string) bool) {
			store, err := sqlitestore.Open(context.Background(), t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = store.Close() })
			// Its notifications are by record, whenever the watcher subscribes.
			return store, store, func(string) bool { return true }
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store, notifier, subscribed := open(t)
			srv := dedupesvc.NewServer(store, dedupesvc.WithNotifier(notifier), dedupesvc.WithPollInterval(time.Hour), dedupesvc.WithLogger(quiet))
			dedupe := dedupesvc.NewInProcessClient(srv)
			ctx := context.Background()
			const key = "taken-over"
			fp := sha256.Sum256([]byte("request"))
			begin := func(token string, maxWait time.Duration) *idemgatev1.BeginRequest {
				return &idemgatev1.BeginRequest{Scope: "/pkg.S/M", Key: key, Fingerprint: fp[:], AttemptToken: token,
					Lease: durationpb.New(dedupesvc.MinLease), Retention: durationpb.New(time.Hour), MaxWait: durationpb.New(maxWait),
					OnLostOutcome: idemgatev1.LostOutcomePolicy_LOST_OUTCOME_POLICY_REEXECUTE}
			}
			if res, err := dedupe.Begin(ctx, begin("holder-a", 0)); err != nil || res.GetReserved() == nil {
				t.Fatalf("the first holder's Begin = %v, %v", res, err)
			}
			// The waiter waits nearly the longest max_wait; with its lease
			// (one second) not renewed, the first holder's reservation runs
			// out meanwhile.
			const maxWait = dedupesvc.MaxWait - 5*time.Second
			answered := make(chan *idemgatev1.BeginResponse, 1)
			go func() {
				waitCtx, cancel := context.WithTimeout(ctx, 2*dedupesvc.MaxWait)
				defer cancel()
				res, err := dedupe.Begin(waitCtx, begin("waiter", maxWait))
				if err != nil {
					t.Errorf("the waiter's Begin: %v", err)
				}
				answered <- res
			}()
			for deadline := time.Now().Add(30 * time.Second); srv.WaitStats().Started == 0 || !subscribed(key); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the waiter did not start waiting within 30s")
				}
			}
			// The second holder takes the key over once the lease ran out.
			var epoch int64
			for deadline := time.Now().Add(30 * time.Second); epoch == 0; time.Sleep(100 * time.Millisecond) {
				res, err := dedupe.Begin(ctx, begin("holder-b", 0))
				switch {
				case err != nil:
					t.Fatalf("the second holder's Begin: %v", err)
				case res.GetReserved() != nil:
					epoch = res.GetReserved().GetEpoch()
				case res.GetInFlight() == nil || time.Now().After(deadline):
					t.Fatalf("the second holder's Begin = %v, want in flight until the lease runs out, then reserved", res)
				}
			}
			outcome := &anypb.Any{TypeUrl: "type.googleapis.com/test.Outcome", Value: []byte("the second holder's")}
			if _, err := dedupe.Finish(ctx, &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: key, AttemptToken: "holder-b", Epoch: epoch, Outcome: outcome}); err != nil {
				t.Fatalf("the second holder's Finish: %v", err)
			}
			res := <-answered
			if got := res.GetCompleted().GetOutcome(); !bytes.Equal(got.GetValue(), outcome.GetValue()) {
				t.Fatalf("the waiter got %v (wait stats %+v), want the second holder's outcome: a takeover must not stop the waiter being woken", res, srv.WaitStats())
			}
		})
	}
}

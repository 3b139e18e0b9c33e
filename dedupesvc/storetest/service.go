package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// as returns ctx authenticated as the calling service name.
func as(name string) context.Context {
	return dedupesvc.ContextWithCaller(ctx, dedupesvc.Caller{Name: name})
}

func beginReq(scope, key, token string) *idemgatev1.BeginRequest {
	return &idemgatev1.BeginRequest{
		Scope: scope, Key: key, Fingerprint: fpA, AttemptToken: token,
		Lease: durationpb.New(long), Retention: durationpb.New(long),
	}
}

// wantInvalid fails unless err is INVALID_ARGUMENT with reason
// DEDUPE_REQUEST_INVALID naming field in its ErrorInfo metadata.
func wantInvalid(t *testing.T, what string, err error, field string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("%s: %v; want INVALID_ARGUMENT", what, err)
	}
	var infos []*errdetails.ErrorInfo
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			infos = append(infos, info)
		}
	}
	if len(infos) != 1 || infos[0].GetReason() != dedupesvc.ReasonInvalidRequest || infos[0].GetMetadata()["field"] != field {
		t.Fatalf("%s: ErrorInfo %v; want one %s with field %q", what, infos, dedupesvc.ReasonInvalidRequest, field)
	}
}

// testServiceNamespaces runs the Dedupe service over the store: one caller
// never reaches another's records, whatever bytes their names and scopes
// hold, and control characters are refused alike on every store.
func testServiceNamespaces(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()

	t.Run("a caller named with a control character cannot reach another's records", func(t *testing.T) {
		t.Parallel()
		srv := dedupesvc.NewServer(newStore(t))
		// Caller "CN=svcC\x1fX" stores an outcome under scope S; caller
		// "CN=svcC" asks for scope "X\x1fS". Joined as one string with the
		// \x1f separator, both were "CN=svcC\x1fX\x1fS".
		victim, attacker := as("CN=svcC\x1fX"), as("CN=svcC")
		begun, err := srv.Begin(victim, beginReq("/pkg.S/M", "k", "t-victim"))
		if err == nil && begun.GetReserved() != nil {
			_, _ = srv.Finish(victim, &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: "k", AttemptToken: "t-victim", Epoch: begun.GetReserved().GetEpoch(),
				Outcome: &anypb.Any{TypeUrl: outA.TypeURL, Value: []byte("secret")}})
		}
		got, attackErr := srv.Begin(attacker, beginReq("X\x1f/pkg.S/M", "k", "t-attacker"))
		if got.GetCompleted() != nil {
			t.Fatalf("caller CN=svcC read the outcome %q of caller CN=svcC\\x1fX", got.GetCompleted().GetOutcome().GetValue())
		}
		wantInvalid(t, "Begin from a caller named with a control character", err, "namespace")
		wantInvalid(t, "Begin with a control character in the scope", attackErr, "scope")
	})

	t.Run("control characters are refused as invalid, never as a store failure", func(t *testing.T) {
		t.Parallel()
		srv := dedupesvc.NewServer(newStore(t))
		for _, c := range []string{"\x00", "\x1f", "\n", "\x7f", "\u0085", "\xff"} {
			_, err := srv.Begin(as("svc"), beginReq("/pkg.S/M|"+c, "k", "t1"))
			wantInvalid(t, "Begin with scope byte "+c, err, "scope")
			_, err = srv.Begin(as("svc"+c), beginReq("/pkg.S/M", "k", "t1"))
			wantInvalid(t, "Begin from caller with byte "+c, err, "namespace")
		}
		begun, err := srv.Begin(as("svc"), beginReq("/pkg.S/M", "k", "t1"))
		if err != nil || begun.GetReserved() == nil {
			t.Fatalf("Begin = %v, %v", begun, err)
		}
		for _, c := range []string{"\x00", "\x1f", "\n", "\x7f", "\xff"} {
			_, err := srv.Finish(as("svc"), &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: "k", AttemptToken: "t1", Epoch: begun.GetReserved().GetEpoch(),
				Outcome: &anypb.Any{TypeUrl: "type.googleapis.com/x" + c, Value: []byte("v")}})
			wantInvalid(t, "Finish with type URL byte "+c, err, "outcome.type_url")
		}
		// Nothing was stored with a control character: the key is still in flight.
		again, err := srv.Begin(as("svc"), beginReq("/pkg.S/M", "k", "t2"))
		if err != nil || again.GetInFlight() == nil {
			t.Fatalf("Begin after refused Finishes = %v, %v; want in flight", again, err)
		}
	})

	t.Run("two callers use the same scope and key independently", func(t *testing.T) {
		t.Parallel()
		srv := dedupesvc.NewServer(newStore(t))
		for _, name := range []string{"svc-a", "svc-b", ""} {
			c := ctx
			if name != "" {
				c = as(name)
			}
			begun, err := srv.Begin(c, beginReq("/pkg.S/M|t", "k", "t-"+name))
			if err != nil || begun.GetReserved() == nil {
				t.Fatalf("Begin as %q = %v, %v; want reserved", name, begun, err)
			}
		}
	})
}

// testNamespaces checks that the namespace is part of a record's identity in
// the store itself, not a prefix of its scope: whatever bytes a namespace and
// scope hold, another namespace never reaches the record.
func testNamespaces(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()
	s := newStore(t)
	in := func(ns, scope string, p dedupesvc.BeginParams) dedupesvc.BeginParams {
		p.Namespace, p.Scope = ns, scope
		return p
	}
	// "a\x1fb" + "c" and "a" + "b\x1fc" were one joined scope.
	r := mustBegin(t, s, in("a\x1fb", "c", begin("t1", fpA, long, long)), dedupesvc.BeginReserved)
	if err := s.Finish(ctx, dedupesvc.FinishParams{Namespace: "a\x1fb", Scope: "c", Key: "key-1", AttemptToken: "t1", Epoch: r.Epoch, Outcome: outA}); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, s, in("a\x1fb", "c", begin("t2", fpA, long, long)), dedupesvc.BeginCompleted)
	other := mustBegin(t, s, in("a", "b\x1fc", begin("t3", fpB, long, long)), dedupesvc.BeginReserved)
	// Epochs are unique across the store, so a fresh record is told by the
	// first one still replaying, not by its epoch being 1.
	if other.Epoch <= r.Epoch {
		t.Fatalf("another namespace's record has epoch %d, want a fresh record's above %d", other.Epoch, r.Epoch)
	}
	mustBegin(t, s, in("a\x1fb", "c", begin("t2", fpA, long, long)), dedupesvc.BeginCompleted)
	// The same scope and key, with and without a namespace, are two records.
	mustBegin(t, s, in("", "c", begin("t4", fpB, long, long)), dedupesvc.BeginReserved)
	mustBegin(t, s, in("x", "c", begin("t5", fpB, long, long)), dedupesvc.BeginReserved)

	// No operation of another namespace reaches the record.
	if err := s.Finish(ctx, dedupesvc.FinishParams{Namespace: "b", Scope: "b\x1fc", Key: "key-1", AttemptToken: "t3", Epoch: other.Epoch, Outcome: outB}); !errors.Is(err, dedupesvc.ErrNotHeld) {
		t.Fatalf("Finish from another namespace = %v, want ErrNotHeld", err)
	}
	if _, err := s.Heartbeat(ctx, dedupesvc.HeartbeatParams{Namespace: "b", Scope: "b\x1fc", Key: "key-1", AttemptToken: "t3", Epoch: other.Epoch, Lease: long}); !errors.Is(err, dedupesvc.ErrNotHeld) {
		t.Fatalf("Heartbeat from another namespace = %v, want ErrNotHeld", err)
	}
	if err := s.Resolve(ctx, dedupesvc.ResolveParams{Namespace: "b", Scope: "c", Key: "key-1", Complete: &outB}); !errors.Is(err, dedupesvc.ErrRecordNotFound) {
		t.Fatalf("Resolve from another namespace = %v, want ErrRecordNotFound", err)
	}
	if err := s.Release(ctx, dedupesvc.ReleaseParams{Namespace: "a", Scope: "b\x1fc", Key: "key-1", AttemptToken: "t3", Epoch: other.Epoch}); err != nil {
		t.Fatalf("Release in its own namespace = %v", err)
	}
	mustBegin(t, s, in("a\x1fb", "c", begin("t6", fpA, long, long)), dedupesvc.BeginCompleted)

	// The inspector names each record with its namespace.
	p := in("ns-swept", "/pkg.S/M", begin("t7", fpA, short, short))
	r = mustBegin(t, s, p, dedupesvc.BeginReserved)
	if err := s.Release(ctx, dedupesvc.ReleaseParams{Namespace: "ns-swept", Scope: "/pkg.S/M", Key: "key-1", AttemptToken: "t7", Epoch: r.Epoch, OutcomeUnknown: true}); err != nil {
		t.Fatal(err)
	}
	if inspector, ok := s.(dedupesvc.Inspector); ok {
		got, found, err := inspector.GetRecord(ctx, dedupesvc.RecordID{Namespace: "ns-swept", Scope: "/pkg.S/M", Key: "key-1"})
		if err != nil || !found || got.ID.Namespace != "ns-swept" || got.State != dedupesvc.StateUnknown {
			t.Fatalf("GetRecord = %+v, %v, %v", got, found, err)
		}
		if _, found, err := inspector.GetRecord(ctx, dedupesvc.RecordID{Scope: "/pkg.S/M", Key: "key-1"}); err != nil || found {
			t.Fatalf("GetRecord without the namespace: found=%v, %v; want none", found, err)
		}
	}
}

// wantQuota fails unless err is RESOURCE_EXHAUSTED DEDUPE_QUOTA_EXCEEDED
// naming quota, with RetryInfo exactly when retry is set.
func wantQuota(t *testing.T, what string, err error, quota string, retry bool) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("%s: %v; want RESOURCE_EXHAUSTED", what, err)
	}
	var infos []*errdetails.ErrorInfo
	hasRetry := false
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			infos = append(infos, d)
		case *errdetails.RetryInfo:
			hasRetry = d.GetRetryDelay().AsDuration() > 0
		}
	}
	if len(infos) != 1 || infos[0].GetReason() != dedupesvc.ReasonQuotaExceeded || infos[0].GetMetadata()["quota"] != quota || infos[0].GetMetadata()["limit"] == "" {
		t.Fatalf("%s: ErrorInfo %v; want one %s with quota %q and its limit", what, infos, dedupesvc.ReasonQuotaExceeded, quota)
	}
	if hasRetry != retry {
		t.Fatalf("%s: RetryInfo present = %v, want %v", what, hasRetry, retry)
	}
}

// settleUsage compacts s's usage when its quotas see changes only once
// compacted (dedupesvc.UsageCompactor), so that the next Begin is checked
// against every write before it, as on a store that counts in the writing
// transaction. How far a quota may be overshot between compactions is the
// store's own test (pgstore's TestQuotaSeesUsageOnceCompacted).
func settleUsage(t *testing.T, s dedupesvc.Store) {
	t.Helper()
	if c, ok := s.(dedupesvc.UsageCompactor); ok {
		if _, err := c.CompactUsage(ctx); err != nil {
			t.Fatalf("CompactUsage: %v", err)
		}
	}
}

// testServiceQuotas checks the per-caller quotas of records and stored
// bytes, counted by the store, and that one caller at its quota leaves
// every other caller, and its own existing keys, alone.
func testServiceQuotas(t *testing.T, newStore func(*testing.T) dedupesvc.Store) {
	t.Parallel()

	t.Run("records", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		srv := dedupesvc.NewServer(s, dedupesvc.WithCallerQuota(3, 0))
		var last *idemgatev1.BeginResponse
		for i := range 3 {
			begun, err := srv.Begin(as("greedy"), beginReq("/pkg.S/M", fmt.Sprintf("k%d", i), "t1"))
			if err != nil || begun.GetReserved() == nil {
				t.Fatalf("Begin %d = %v, %v", i, begun, err)
			}
			last = begun
		}
		settleUsage(t, s)
		_, err := srv.Begin(as("greedy"), beginReq("/pkg.S/M", "k3", "t1"))
		wantQuota(t, "a fourth record", err, dedupesvc.QuotaRecords, false)
		// Its own existing keys are still answered, and finished.
		dup, err := srv.Begin(as("greedy"), beginReq("/pkg.S/M", "k2", "t2"))
		if err != nil || dup.GetInFlight() == nil {
			t.Fatalf("a duplicate at the quota = %v, %v; want in flight", dup, err)
		}
		if _, err := srv.Finish(as("greedy"), &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: "k2", AttemptToken: "t1", Epoch: last.GetReserved().GetEpoch(),
			Outcome: &anypb.Any{TypeUrl: outA.TypeURL, Value: []byte("v")}}); err != nil {
			t.Fatalf("Finish at the quota: %v", err)
		}
		// Another caller is not affected.
		if begun, err := srv.Begin(as("neighbour"), beginReq("/pkg.S/M", "k3", "t1")); err != nil || begun.GetReserved() == nil {
			t.Fatalf("the neighbour's Begin = %v, %v; want reserved", begun, err)
		}
	})

	t.Run("records, concurrent Begins through the service", func(t *testing.T) {
		// The service lets Begins far below a quota skip the store's usage
		// read (dedupesvc.UsageReader); near it, the store checks again.
		// Once the service has read the caller's usage, 1,000 concurrent
		// Begins against a quota of 200 reserve no more than the store's
		// own check would let through.
		t.Parallel()
		s := newStore(t)
		const limit, warm, begins = 200, 100, 1000
		bound := 0
		if o, ok := s.(QuotaOvershooter); ok {
			bound = o.MaxQuotaOvershoot()
		}
		srv := dedupesvc.NewServer(s, dedupesvc.WithCallerQuota(limit, 0))
		for i := range warm {
			if begun, err := srv.Begin(as("greedy"), beginReq("/pkg.S/M", fmt.Sprint("warm", i), "t1")); err != nil || begun.GetReserved() == nil {
				t.Fatalf("Begin %d = %v, %v", i, begun, err)
			}
		}
		var (
			wg       sync.WaitGroup
			reserved atomic.Int64
		)
		for i := range begins {
			wg.Go(func() {
				begun, err := srv.Begin(as("greedy"), beginReq("/pkg.S/M", fmt.Sprint("k", i), "t1"))
				switch {
				case status.Code(err) == codes.ResourceExhausted:
				case err != nil || begun.GetReserved() == nil:
					t.Errorf("Begin = %v, %v", begun, err)
				default:
					reserved.Add(1)
				}
			})
		}
		wg.Wait()
		n := warm + reserved.Load()
		t.Logf("%d Begins, then %d at once, against a records quota of %d: %d reserved (stated bound %d over)", warm, begins, limit, n, bound)
		if n < limit || n > limit+int64(bound) {
			t.Fatalf("against a records quota of %d, %d reserved; want %d to %d", limit, n, limit, limit+bound)
		}
	})

	t.Run("bytes, freed by the sweeper", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		srv := dedupesvc.NewServer(s, dedupesvc.WithCallerQuota(0, 1000))
		req := beginReq("/pkg.S/M", "big", "t1")
		req.Lease, req.Retention = durationpb.New(time.Second), durationpb.New(time.Second)
		begun, err := srv.Begin(as("greedy"), req)
		if err != nil || begun.GetReserved() == nil {
			t.Fatalf("Begin = %v, %v", begun, err)
		}
		// An outcome that fills the quota exactly is stored, and the quota
		// is then used up.
		if _, err := srv.Finish(as("greedy"), &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: "big", AttemptToken: "t1", Epoch: begun.GetReserved().GetEpoch(),
			Outcome: &anypb.Any{TypeUrl: outA.TypeURL, Value: make([]byte, 1000)}}); err != nil {
			t.Fatalf("Finish up to the quota: %v", err)
		}
		settleUsage(t, s)
		_, err = srv.Begin(as("greedy"), beginReq("/pkg.S/M", "next", "t1"))
		wantQuota(t, "a Begin past the bytes quota", err, dedupesvc.QuotaBytes, false)
		if begun, err := srv.Begin(as("neighbour"), beginReq("/pkg.S/M", "next", "t1")); err != nil || begun.GetReserved() == nil {
			t.Fatalf("the neighbour's Begin = %v, %v; want reserved", begun, err)
		}
		// Once the big record expires and is swept, the caller may go on.
		deadline := time.Now().Add(time.Minute)
		for {
			time.Sleep(200 * time.Millisecond)
			if _, _, err := s.DeleteExpired(ctx, 100); err != nil {
				t.Fatal(err)
			}
			settleUsage(t, s)
			begun, err := srv.Begin(as("greedy"), beginReq("/pkg.S/M", "next", "t1"))
			if err == nil && begun.GetReserved() != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the sweep, Begin = %v, %v; want reserved", begun, err)
			}
		}
	})
}

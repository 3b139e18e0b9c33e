package storetest

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// Raw reads and writes a record's stored outcome columns with the store's own
// SQL, around the Store, for the encryption cases: what is at rest, and a
// sealed value moved to another row.
type Raw struct {
	// Outcome returns the record's outcome_value and outcome_key_id ("" for
	// NULL).
	Outcome func(t *testing.T, s dedupesvc.Store, id dedupesvc.RecordID) (value []byte, keyID string)
	// SetOutcome overwrites them ("" writes NULL).
	SetOutcome func(t *testing.T, s dedupesvc.Store, id dedupesvc.RecordID, value []byte, keyID string)
}

// RunEncryption runs the Dedupe service over the store with an outcome
// cipher (WithOutcomeCipher): outcomes are sealed at rest and replayed
// byte for byte, records under a rotated-out active key still replay, and
// records written before encryption only with WithPlaintextOutcomes, and a
// record that cannot be opened answers
// INTERNAL DEDUPE_OUTCOME_UNREADABLE instead of counting as absent.
func RunEncryption(t *testing.T, newStore func(t *testing.T) dedupesvc.Store, raw Raw) {
	const svc = "svc"
	secret := []byte("ch_3PqR cus_Nf8 card 4242")
	k := func(id string, b byte) dedupesvc.OutcomeKey {
		return dedupesvc.OutcomeKey{ID: id, Key: bytes.Repeat([]byte{b}, dedupesvc.OutcomeKeyBytes)}
	}
	newCipher := func(t *testing.T, keys ...dedupesvc.OutcomeKey) *dedupesvc.OutcomeCipher {
		t.Helper()
		c, err := dedupesvc.NewOutcomeCipher(keys)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	rid := func(key string) dedupesvc.RecordID {
		return dedupesvc.RecordID{Namespace: svc, Scope: "/pkg.S/Charge", Key: key}
	}
	// complete reserves key and finishes it with value through srv.
	complete := func(t *testing.T, srv *dedupesvc.Server, key string, value []byte) {
		t.Helper()
		begun, err := srv.Begin(as(svc), beginReq("/pkg.S/Charge", key, "t-"+key))
		if err != nil || begun.GetReserved() == nil {
			t.Fatalf("Begin %s = %v, %v; want reserved", key, begun, err)
		}
		if _, err := srv.Finish(as(svc), &idemgatev1.FinishRequest{Scope: "/pkg.S/Charge", Key: key, AttemptToken: "t-" + key,
			Epoch: begun.GetReserved().GetEpoch(), Outcome: &anypb.Any{TypeUrl: outA.TypeURL, Value: value}}); err != nil {
			t.Fatalf("Finish %s: %v", key, err)
		}
	}
	// replay fails unless a duplicate Begin of key replays value.
	replay := func(t *testing.T, srv *dedupesvc.Server, key string, value []byte) {
		t.Helper()
		got, err := srv.Begin(as(svc), beginReq("/pkg.S/Charge", key, "t-dup-"+key))
		if err != nil || got.GetCompleted() == nil {
			t.Fatalf("duplicate Begin %s = %v, %v; want completed", key, got, err)
		}
		if o := got.GetCompleted().GetOutcome(); o.GetTypeUrl() != outA.TypeURL || !bytes.Equal(o.GetValue(), value) {
			t.Fatalf("duplicate Begin %s replayed %q %q; want %q %q", key, o.GetTypeUrl(), o.GetValue(), outA.TypeURL, value)
		}
	}
	// unreadable fails unless a duplicate Begin of key answers INTERNAL
	// DEDUPE_OUTCOME_UNREADABLE, twice: the record is never taken for absent.
	unreadable := func(t *testing.T, srv *dedupesvc.Server, key string) {
		t.Helper()
		for i := range 2 {
			got, err := srv.Begin(as(svc), beginReq("/pkg.S/Charge", key, "t-dup-"+key))
			if status.Code(err) != codes.Internal || grpcerr.Reason(err) != dedupesvc.ReasonOutcomeUnreadable {
				t.Fatalf("duplicate Begin %d of %s = %v, %v; want INTERNAL %s", i, key, got, err, dedupesvc.ReasonOutcomeUnreadable)
			}
		}
	}

	t.Run("outcomes are sealed at rest and replayed byte for byte", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		srv := dedupesvc.NewServer(s, dedupesvc.WithOutcomeCipher(newCipher(t, k("k1", 1))))
		complete(t, srv, "a", secret)
		complete(t, srv, "empty", []byte{})
		value, keyID := raw.Outcome(t, s, rid("a"))
		if keyID != "k1" || bytes.Contains(value, secret) || len(value) != len(secret)+dedupesvc.SealedOverhead {
			t.Fatalf("stored outcome %q under key id %q; want it sealed under k1", value, keyID)
		}
		replay(t, srv, "a", secret)
		replay(t, srv, "empty", []byte{})
	})

	t.Run("a record written before encryption was turned on replays only when plaintext is accepted", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		complete(t, dedupesvc.NewServer(s), "a", secret)
		if _, keyID := raw.Outcome(t, s, rid("a")); keyID != "" {
			t.Fatalf("outcome stored without a cipher has key id %q", keyID)
		}
		unreadable(t, dedupesvc.NewServer(s, dedupesvc.WithOutcomeCipher(newCipher(t, k("k1", 1)))), "a")
		replay(t, dedupesvc.NewServer(s, dedupesvc.WithOutcomeCipher(newCipher(t, k("k1", 1))), dedupesvc.WithPlaintextOutcomes(true)), "a", secret)
		replay(t, dedupesvc.NewServer(s), "a", secret) // encryption off again
	})

	t.Run("a plaintext outcome planted while encryption is on is refused", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		srv := dedupesvc.NewServer(s, dedupesvc.WithOutcomeCipher(newCipher(t, k("k1", 1))))
		complete(t, srv, "a", secret)
		raw.SetOutcome(t, s, rid("a"), []byte("forged"), "")
		unreadable(t, srv, "a")
	})

	t.Run("rotation: old records open after a key is added, new ones use it", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		c := newCipher(t, k("k1", 1))
		srv := dedupesvc.NewServer(s, dedupesvc.WithOutcomeCipher(c))
		complete(t, srv, "old", secret)
		if err := c.SetKeys([]dedupesvc.OutcomeKey{k("k1", 1), k("k2", 2)}); err != nil {
			t.Fatal(err)
		}
		complete(t, srv, "new", []byte("new secret"))
		if _, keyID := raw.Outcome(t, s, rid("new")); keyID != "k2" {
			t.Fatalf("outcome after rotation sealed with %q; want k2", keyID)
		}
		replay(t, srv, "old", secret)
		replay(t, srv, "new", []byte("new secret"))
	})

	t.Run("a record whose key is gone answers INTERNAL and is never reserved again", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		complete(t, dedupesvc.NewServer(s, dedupesvc.WithOutcomeCipher(newCipher(t, k("k1", 1)))), "a", secret)
		unreadable(t, dedupesvc.NewServer(s, dedupesvc.WithOutcomeCipher(newCipher(t, k("k2", 2)))), "a")
		unreadable(t, dedupesvc.NewServer(s), "a") // encryption turned off: still sealed
	})

	t.Run("a sealed outcome copied to another record does not open", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		srv := dedupesvc.NewServer(s, dedupesvc.WithOutcomeCipher(newCipher(t, k("k1", 1))))
		complete(t, srv, "a", secret)
		complete(t, srv, "b", []byte("b's outcome"))
		value, keyID := raw.Outcome(t, s, rid("a"))
		raw.SetOutcome(t, s, rid("b"), value, keyID)
		unreadable(t, srv, "b")
		replay(t, srv, "a", secret)
	})

	t.Run("Resolve and ResolveRecord seal, and a retried Resolve is a retry", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		srv := dedupesvc.NewServer(s, dedupesvc.WithOutcomeCipher(newCipher(t, k("k1", 1))))
		admin, err := dedupesvc.NewAdminServer(s, srv)
		if err != nil {
			t.Skip(err)
		}
		for _, key := range []string{"svc", "admin"} {
			begun, err := srv.Begin(as(svc), beginReq("/pkg.S/Charge", key, "t-"+key))
			if err != nil || begun.GetReserved() == nil {
				t.Fatalf("Begin %s = %v, %v", key, begun, err)
			}
			if _, err := srv.Release(as(svc), &idemgatev1.ReleaseRequest{Scope: "/pkg.S/Charge", Key: key, AttemptToken: "t-" + key,
				Epoch: begun.GetReserved().GetEpoch(), OutcomeUnknown: true}); err != nil {
				t.Fatalf("Release %s: %v", key, err)
			}
		}
		for i := range 2 { // the second is a retry after a lost answer
			if _, err := srv.Resolve(as(svc), &idemgatev1.ResolveRequest{Scope: "/pkg.S/Charge", Key: "svc",
				Resolution: &idemgatev1.ResolveRequest_Complete{Complete: &anypb.Any{TypeUrl: outA.TypeURL, Value: secret}}}); err != nil {
				t.Fatalf("Resolve %d: %v", i, err)
			}
			if _, err := admin.ResolveRecord(ctx, &idemgatev1.ResolveRecordRequest{Ref: &idemgatev1.RecordRef{Namespace: svc, Scope: "/pkg.S/Charge", Key: "admin"},
				Resolution: &idemgatev1.ResolveRecordRequest_Complete{Complete: &anypb.Any{TypeUrl: outA.TypeURL, Value: secret}}}); err != nil {
				t.Fatalf("ResolveRecord %d: %v", i, err)
			}
		}
		for _, key := range []string{"svc", "admin"} {
			if value, keyID := raw.Outcome(t, s, rid(key)); keyID != "k1" || bytes.Contains(value, secret) {
				t.Fatalf("resolved outcome of %s stored as %q under %q; want sealed under k1", key, value, keyID)
			}
			replay(t, srv, key, secret)
		}
	})

	t.Run("the outcome size limit applies to the plaintext", func(t *testing.T) {
		t.Parallel()
		srv := dedupesvc.NewServer(newStore(t), dedupesvc.WithOutcomeCipher(newCipher(t, k("k1", 1))), dedupesvc.WithMaxOutcomeBytes(len(secret)))
		complete(t, srv, "a", secret)
		replay(t, srv, "a", secret)
	})
}

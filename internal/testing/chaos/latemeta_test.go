package chaos

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
)

// Every OK answer of a late-metadata action must carry its handler's
// header and trailer, byte for byte; a run where no handler set them after
// its caller left tested nothing.
func TestCheckLateMetadata(t *testing.T) {
	t.Parallel()
	key := "a00001" + LateMetadataSuffix
	body, err := proto.Marshal(&testingv1.ChargeResponse{ChargeId: "tool0-1-1", Action: key, Epoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	withMetadata := func(a Attempt) Attempt {
		a.Header = map[string][][]byte{ChargeIDHeader: {[]byte("tool0-1-1")}}
		a.Trailer = map[string][][]byte{ResponseTrailer: {body}}
		return a
	}
	gaveUp := Attempt{Key: key, Action: key, Method: failClosed, Attempt: 1, Try: 1, Start: t0, End: t0, Code: "Canceled"}
	ledger := run(key, failClosed, "tool0", string(body), t0, "")
	ledger[2].CallerGone = true

	good := []Attempt{gaveUp, withMetadata(ok(key, failClosed, 0, string(body), true)), withMetadata(ok(key, failClosed, 1, string(body), true))}
	if r := Check("late", 1, good, ledger, 0, nil, nil, Rules{}); r.Failed() || r.LateMetadataRuns != 1 || r.GaveUp != 1 {
		t.Errorf("every replay with the metadata: %s", r)
	}

	missing := []Attempt{gaveUp, withMetadata(ok(key, failClosed, 0, string(body), true)), ok(key, failClosed, 1, string(body), true)}
	if r := Check("late", 1, missing, ledger, 0, nil, nil, Rules{}); !r.Failed() || r.MissingMetadata != 1 {
		t.Errorf("a replay without the metadata: %s", r)
	}
	changed := withMetadata(ok(key, failClosed, 1, string(body), true))
	changed.Trailer[ResponseTrailer][0] = append([]byte(nil), body[:len(body)-1]...)
	if r := Check("late", 1, []Attempt{gaveUp, changed}, ledger, 0, nil, nil, Rules{}); !r.Failed() || r.MissingMetadata != 1 {
		t.Errorf("a replay with other metadata bytes: %s", r)
	}

	live := concat(run(key, failClosed, "tool0", string(body), t0, ""))
	if r := Check("late", 1, good, live, 0, nil, nil, Rules{}); !r.Failed() || !strings.Contains(r.String(), "did not test it") {
		t.Errorf("no handler set metadata after its caller left: %s", r)
	}
	// Other keys are not held to it.
	plain := ok("a00002", failClosed, 0, "r1", false)
	if r := Check("plain", 1, []Attempt{plain}, run("a00002", failClosed, "tool0", "r1", t0, ""), 0, nil, nil, Rules{}); r.Failed() || r.LateMetadataActions != 0 {
		t.Errorf("an action without the suffix: %s", r)
	}
}

package pgstore

import (
	"testing"
	"time"
)

// TestAwayBackoff: the backoff between tries of an unreachable database
// doubles from resumeBackoffMin to resumeBackoffCap, and a jittered wait is
// between half of it and all of it, so the wait never exceeds the cap (the
// store's return is noticed within it) nor falls below half of it (the
// bound on tries a second).
func TestAwayBackoff(t *testing.T) {
	t.Parallel()
	var got []time.Duration
	for d := time.Duration(0); len(got) < 8; {
		d = awayBackoff(d)
		got = append(got, d)
	}
	want := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second, time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("backoffs %v, want %v", got, want)
		}
	}
	for _, d := range want {
		for range 1000 {
			if w := jittered(d); w < d/2 || w > d {
				t.Fatalf("jittered(%v) = %v, want within [%v, %v]", d, w, d/2, d)
			}
		}
	}
}

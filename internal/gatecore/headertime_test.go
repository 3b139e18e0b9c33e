package gatecore_test

import (
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/gatecore"
)

func TestHeaderTimeIsMillisecondsInUTC(t *testing.T) {
	berlin := time.FixedZone("CET", 3600)
	for _, tc := range []struct {
		in   time.Time
		want string
	}{
		// A tool server's estimate (nanoseconds) and the stores' values
		// (PostgreSQL microseconds, the embedded store milliseconds) of one
		// millisecond read alike.
		{time.Date(2026, 12, 3, 1, 5, 45, 93626206, time.UTC), "2026-12-03T01:05:45.093Z"},
		{time.Date(2026, 12, 3, 1, 5, 45, 93999000, time.UTC), "2026-12-03T01:05:45.093Z"},
		{time.Date(2026, 12, 3, 1, 5, 45, 93000000, time.UTC), "2026-12-03T01:05:45.093Z"},
		// Whole seconds keep their digits; other zones are spelled in UTC.
		{time.Date(2026, 12, 3, 1, 5, 45, 0, time.UTC), "2026-12-03T01:05:45.000Z"},
		{time.Date(2026, 12, 3, 2, 5, 45, 999999999, berlin), "2026-12-03T01:05:45.999Z"},
	} {
		got := gatecore.HeaderTime(tc.in)
		if got != tc.want {
			t.Errorf("HeaderTime(%v) = %q, want %q", tc.in, got, tc.want)
		}
		if back, err := time.Parse(time.RFC3339Nano, got); err != nil || back.After(tc.in) {
			t.Errorf("%q parses as %v (%v): want RFC 3339 no later than %v", got, back, err, tc.in)
		}
	}
}

package gatecore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/gatecore"
)

func TestDurationsCheckNamesTheFieldOutOfBounds(t *testing.T) {
	for _, tc := range []struct {
		d    gatecore.Durations
		want string
	}{
		{gatecore.Durations{}, ""},
		{gatecore.Durations{Lease: time.Millisecond}, "Lease 1ms"},
		{gatecore.Durations{Lease: 25 * time.Hour, Retention: 48 * time.Hour}, "Lease 25h"},
		{gatecore.Durations{Lease: time.Hour, Retention: time.Minute}, "Retention 1m0s"},
		{gatecore.Durations{Retention: 400 * 24 * time.Hour}, "Retention 9600h"},
		{gatecore.Durations{MaxWait: 2 * time.Minute}, "MaxWait 2m0s"},
		{gatecore.Durations{MaxWait: -time.Second}, "MaxWait -1s"},
		{gatecore.Durations{ExecutionTimeout: time.Millisecond}, "ExecutionTimeout 1ms"},
		{gatecore.Durations{Keyless: true, KeylessWindow: time.Second}, "KeylessWindow 1s"},
		{gatecore.Durations{Keyless: false, KeylessWindow: time.Second}, ""},
		{gatecore.Durations{NoWait: true}, ""},
		{gatecore.Durations{NoWait: true, MaxWait: time.Second}, "MaxWait 1s with NoWait"},
	} {
		err := tc.d.Check()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v, want in bounds", tc.d, err)
		case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), "policy "+tc.want)):
			t.Errorf("%+v: %v, want an error starting %q", tc.d, err, "policy "+tc.want)
		}
	}
	if d := (gatecore.Durations{}).WithDefaults(); d.Lease != gatecore.DefaultLease || d.Retention != gatecore.DefaultRetention ||
		d.MaxWait != gatecore.DefaultMaxWait || d.ExecutionTimeout != gatecore.DefaultExecutionTimeout || d.KeylessWindow != gatecore.DefaultKeylessWindow {
		t.Errorf("defaults %+v", d)
	}
}

// TestNoWaitKeepsMaxWaitZero: a zero MaxWait takes the 3s default, but
// not under NoWait, which is how a Go policy says a method's max_wait 0s.
func TestNoWaitKeepsMaxWaitZero(t *testing.T) {
	if d := (gatecore.Durations{NoWait: true}).WithDefaults(); d.MaxWait != 0 || d.Lease != gatecore.DefaultLease {
		t.Errorf("NoWait: %+v, want MaxWait 0 and the other defaults", d)
	}
	if d := (gatecore.Durations{}).WithDefaults(); d.MaxWait != gatecore.DefaultMaxWait {
		t.Errorf("zero: MaxWait %s, want %s", d.MaxWait, gatecore.DefaultMaxWait)
	}
}

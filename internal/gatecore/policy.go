package gatecore

import (
	"fmt"
	"time"
)

// Policy defaults and bounds, the same for every front end: a method's
// (idemgate.v1.policy), an MCP tool's ToolPolicy and an HTTP route's
// RoutePolicy mean the same by the same durations.
const (
	// DefaultRetention is how long an outcome is replayed: 24h.
	DefaultRetention = 24 * time.Hour
	// DefaultLease is how long a reservation is held without a heartbeat
	// before it counts as abandoned: 10s, renewed about every third of it
	// while the handler runs.
	DefaultLease = 10 * time.Second
	// DefaultMaxWait is how long a duplicate waits for an in-flight
	// original's outcome before it gets IDEMPOTENCY_IN_FLIGHT: 3s.
	DefaultMaxWait = 3 * time.Second
	// DefaultExecutionTimeout bounds a handler's run: 60s.
	DefaultExecutionTimeout = 60 * time.Second
	// DefaultKeylessWindow is how long identical keyless calls collapse
	// into one when deduplicated on their fingerprint: 60s.
	DefaultKeylessWindow = 60 * time.Second

	// MinLease and MaxLease bound a lease: 1s and 24h, the longest the
	// Dedupe service renews a lease to.
	MinLease = time.Second
	MaxLease = 24 * time.Hour
	// MaxRetention is the longest retention: 365 days.
	MaxRetention = 365 * 24 * time.Hour
	// MaxMaxWait is the longest wait for an in-flight original: 60s.
	MaxMaxWait = 60 * time.Second
	// MinExecutionTimeout and MaxExecutionTimeout bound a handler's run: 1s
	// and 24h.
	MinExecutionTimeout = time.Second
	MaxExecutionTimeout = 24 * time.Hour
)

// Durations are the durations of a policy configured in Go (mcpgate's
// ToolPolicy, httpgate's RoutePolicy), where a zero field takes its
// default.
type Durations struct {
	Retention, Lease, MaxWait, ExecutionTimeout, KeylessWindow time.Duration
	// Keyless says the policy deduplicates keyless calls on their
	// fingerprint for KeylessWindow.
	Keyless bool
	// NoWait keeps MaxWait 0, which a zero field cannot say: a duplicate
	// is answered IDEMPOTENCY_IN_FLIGHT at once, as a method's max_wait 0s
	// is. MaxWait must then be 0. Defaults to false.
	NoWait bool
}

// WithDefaults returns d with every zero duration set to its default, but
// MaxWait under NoWait.
func (d Durations) WithDefaults() Durations {
	for _, f := range []struct {
		d   *time.Duration
		def time.Duration
	}{{&d.Retention, DefaultRetention}, {&d.Lease, DefaultLease}, {&d.MaxWait, DefaultMaxWait},
		{&d.ExecutionTimeout, DefaultExecutionTimeout}, {&d.KeylessWindow, DefaultKeylessWindow}} {
		if *f.d == 0 && (f.d != &d.MaxWait || !d.NoWait) {
			*f.d = f.def
		}
	}
	return d
}

// Check returns an error naming the first duration of d (defaults applied)
// out of its bounds, by its Go field name; nil when all are in bounds.
func (d Durations) Check() error {
	if d.NoWait && d.MaxWait != 0 {
		return fmt.Errorf("policy MaxWait %s with NoWait: set one of them", d.MaxWait)
	}
	d = d.WithDefaults()
	switch {
	case d.Lease < MinLease || d.Lease > MaxLease:
		return fmt.Errorf("policy Lease %s is outside %s to %s", d.Lease, MinLease, MaxLease)
	case d.Retention < d.Lease || d.Retention > MaxRetention:
		return fmt.Errorf("policy Retention %s must be between the lease %s and %s", d.Retention, d.Lease, MaxRetention)
	case d.MaxWait < 0 || d.MaxWait > MaxMaxWait:
		return fmt.Errorf("policy MaxWait %s is outside 0s to %s", d.MaxWait, MaxMaxWait)
	case d.ExecutionTimeout < MinExecutionTimeout || d.ExecutionTimeout > MaxExecutionTimeout:
		return fmt.Errorf("policy ExecutionTimeout %s is outside %s to %s", d.ExecutionTimeout, MinExecutionTimeout, MaxExecutionTimeout)
	case d.Keyless && (d.KeylessWindow < d.Lease || d.KeylessWindow > d.Retention):
		return fmt.Errorf("policy KeylessWindow %s must be between the lease %s and the retention %s", d.KeylessWindow, d.Lease, d.Retention)
	}
	return nil
}

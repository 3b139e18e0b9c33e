package interceptor

import (
	"context"
	"time"

	"google.golang.org/grpc"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/gatecore"
)

// What the tool server says about its Dedupe service. Without it a tool
// server whose Dedupe service is down, or refuses its credentials, fails
// every gated call and logs nothing, and its own health looks fine.

// DefaultDedupeFailureLogInterval is how often at most a Dedupe RPC failure
// is logged while the failure stays the same (WithDedupeFailureLogInterval).
const DefaultDedupeFailureLogInterval = gatecore.DefaultDedupeFailureLogInterval

// WithDedupeConn names the connection the Gate's Dedupe client uses: the
// log lines about failing Dedupe RPCs carry its target, WatchDedupe
// follows its connectivity state, and a Dedupe RPC that fails UNAVAILABLE
// makes the connection reconnect at once (at most every 500ms) instead of
// waiting out grpc-go's reconnect backoff, which grows to two minutes: a
// holder renews its lease within the one-lease grace a restarted Dedupe
// service grants it. Defaults to none: the lines name no target, WatchDedupe
// goes by the RPCs' answers alone, reconnects keep the dial's backoff, and
// New logs a warning saying so.
func WithDedupeConn(conn *grpc.ClientConn) Option {
	return func(o *options) { o.dedupeConn = conn }
}

// WithDedupeFailureLogInterval sets how often at most a failing Dedupe RPC
// is logged: the first failure, and one with another status code, at once;
// while the same failure goes on, one line per interval that counts the
// failures not logged in "suppressed". Defaults to
// DefaultDedupeFailureLogInterval, 10s.
func WithDedupeFailureLogInterval(d time.Duration) Option {
	return func(o *options) { o.dedupeLogEvery = d }
}

// CheckDedupe asks the Dedupe service whether it serves this tool server,
// for a start-up check: it renews the lease of a record that never exists
// (one Heartbeat), which crosses the network, the service's authentication
// and request validation and reads its store, and changes nothing; a working
// service answers that the reservation is not held (and does not count the
// probe as a fenced renewal, nor as any outcome). It returns nil then. Otherwise it returns UNAVAILABLE
// (IDEMPOTENCY_STORE_UNAVAILABLE) when the service or its store cannot be
// reached or is too slow, or INTERNAL (IDEMPOTENCY_STORE_REJECTED) when the
// service refuses this tool server or its request; either with ErrorInfo
// metadata "dedupe_code" (the service's status code) and, with
// WithDedupeConn, "dedupe" (its address). ctx bounds the check; without a
// deadline, the Gate's Dedupe timeout does.
func (g *Gate) CheckDedupe(ctx context.Context) error {
	return g.dedupe.Check(ctx, g.opts.dedupeTimeout)
}

// WatchDedupe keeps hs's status for DedupeHealthService in step with the
// Dedupe service until ctx ends, then returns: NOT_SERVING while the
// connection (WithDedupeConn) is not ready or the service's last answer to
// a gated call or a check was a failure (unreachable, refusing this tool
// server, broken), SERVING otherwise; it starts NOT_SERVING until it knows.
// A quota refusal (RESOURCE_EXHAUSTED) is logged but leaves health alone:
// it is one caller's limit, and the service still serves the others. It
// keeps the connection connecting when it falls idle, so a service that
// went away is noticed without traffic, checks each new connection once it
// is ready (CheckDedupe; this also authenticates the connection at once,
// within the Dedupe service's -unauthenticated-timeout), and re-checks a
// failing service every 5s, so health recovers without traffic too. Each
// change is logged. Run it in its own goroutine.
func (g *Gate) WatchDedupe(ctx context.Context, hs idemgate.HealthSetter) { g.dedupe.Watch(ctx, hs) }

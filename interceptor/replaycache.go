package interceptor

import "github.com/idemgate/idemgate/internal/gatecore"

// ReplayCacheClockMargin is taken off a record's expiry before a cached
// outcome is served: the expiry is the Dedupe service's clock (or, after a
// Finish, this process's estimate of it), and this process's clock may run
// behind it. A cached outcome is never served within this margin of its
// record's expiry. 5s.
const ReplayCacheClockMargin = gatecore.ReplayCacheClockMargin

// DefaultReplayCacheTTL is how long a cached outcome is served at most, by
// default (WithReplayCacheTTL): 1m.
const DefaultReplayCacheTTL = gatecore.DefaultReplayCacheTTL

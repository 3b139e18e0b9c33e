package gatecore

import "time"

// HeaderTimeLayout is how every gate spells the times of its
// Idempotency-Expires-At and Idempotency-Original-Time headers (and gRPC
// metadata): RFC 3339 in UTC with exactly three fractional digits.
const HeaderTimeLayout = "2006-01-02T15:04:05.000Z07:00"

// HeaderTime spells t as the gates' time headers carry it, truncated to the
// millisecond: the precision of the coarsest store (the embedded store
// keeps milliseconds, PostgreSQL microseconds), so a first answer's expiry
// (this process's estimate) and a replay's (the store's) read alike on
// every store. Truncating keeps what the header promises: the record lives
// at least until then.
func HeaderTime(t time.Time) string {
	return t.UTC().Truncate(time.Millisecond).Format(HeaderTimeLayout)
}

// Package gatetest is the conformance suite every idemgate gate must pass,
// as dedupesvc/storetest is for stores: once per key, concurrent duplicates,
// key reuse and key checks, a caller that gives up, execution timeouts,
// retryable and final errors, fencing, a lost Begin answer, unknown
// outcomes under both policies, answering before the outcome is stored, the
// replay cache and a Dedupe service that is down, written once against a
// small adapter interface and run over the adapter's real transport.
//
// The suite owns the handler (a ledger that counts executions per label and
// can block one until the case releases it) and the Dedupe service (the real
// dedupesvc on its own PostgreSQL schema per case, reached through an
// internal/netfault proxy per gate, so a case can cut or delay it). The
// adapter owns the gate and the transport: its NewGate serves the suite's
// handler behind every method of idemgate.testing.v1.ConformanceService,
// each with the method's (idemgate.v1.policy), and returns a Client that
// calls them:
//
//	func TestConformance(t *testing.T) {
//		gatetest.Run(t, func(t *testing.T, cfg gatetest.Config) gatetest.Client {
//			// serve cfg.Handler through the gate on cfg.DedupeAddr, dial it
//			return client
//		})
//	}
//
// A gate that cannot express a method's policy or a handler's mark answers
// the calls concerned with an Answer whose Err wraps ErrUnsupported; the
// case then fails naming what is missing, it is never skipped.
//
// PostgreSQL is the local server internal/pgtest names; without it the
// suite skips, except under CI=true, where it fails.
package gatetest

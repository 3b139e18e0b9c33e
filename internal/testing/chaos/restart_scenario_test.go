package chaos

import (
	"time"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
)

// restartOutage is how long restartWithDefaultBackoff keeps the Dedupe
// service down. With grpc-go's default reconnect backoff (1s, x1.6, jitter
// 0.2) a connection lost at the kill tries again about 1, 2.6, 5.2, 9.3,
// 15.8, 26 and 43s later, so after 30s the holder's tool server would next
// try some 13s after the restart, well past the 6s grace the restart grants.
const restartOutage = 30 * time.Second

// restartWorkload is traffic where each fault finds a handler of the method
// it needs at the pause point on the first tool server: many pausing
// actions, half REEXECUTE, spread over two restarts.
var restartWorkload = Workload{Reexecute: 0.5, Pause: 0.8, Ambiguous: 0.05, Actions: 50, Spread: 90 * time.Second}

// dialWithDefaultBackoff makes the first tool server dial its Dedupe
// service as docs/gating.md shows (grpc-go's default reconnect backoff,
// WithDedupeConn); the second keeps chaos-tool's one-second backoff, as a
// replica that happened to reconnect first.
func dialWithDefaultBackoff(st *Stack) {
	st.Tools[0].ToolArgs = append(st.Tools[0].ToolArgs, "-default-backoff")
}

// restartWithDefaultBackoff returns a fault that waits for a handler at the
// pause point on the default-backoff tool server, alternately of a
// REEXECUTE and a FAIL_CLOSED method, kills the Dedupe service, keeps it
// down restartOutage and restarts it on the same address. The restart
// grants the holder one lease; its duplicates reach the restarted service
// through the other tool server at once, so a holder that renews after the
// grace loses its key (a re-run, or an outcome-unknown answer).
func restartWithDefaultBackoff() func(*Stack, <-chan struct{}) error {
	n := 0
	return func(st *Stack, done <-chan struct{}) error {
		n++
		method := testingv1.ChaosService_ChargeReexecute_FullMethodName
		if n%2 == 0 {
			method = testingv1.ChaosService_Charge_FullMethodName
		}
		if _, err := st.AtPausePoint(done, method, st.Tools[0]); err != nil {
			return skipped(st, err)
		}
		st.KillDedupe(st.Dedupes[0], restartOutage)
		st.sleep(recovery)
		return nil
	}
}

// restartScenario is the restart after an outage whose holder's tool
// server dials with grpc-go's default reconnect backoff (issue 18): no
// holder is harmed, so the strict rules hold.
func restartScenario() Scenario {
	return Scenario{Name: StorePostgres + "/dedupe-restart-default-backoff", Store: StorePostgres, Tools: 2, Workload: restartWorkload, Outages: 2,
		Setup: dialWithDefaultBackoff, Fault: restartWithDefaultBackoff()}
}

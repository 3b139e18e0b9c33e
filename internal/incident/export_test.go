package incident

import (
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
)

// Stall makes every call of a replay wait d before it runs, as on a machine
// whose CPUs other processes take.
func Stall(cfg *Config, d time.Duration) { cfg.stall = d }

// ServiceDefaults gives the replay's Dedupe service opts before the demo's
// own options, as the defaults it would otherwise have: a default per-caller
// rate of one Begin a second is what the real default of 500 is to a machine
// 500 times faster than this one.
func ServiceDefaults(cfg *Config, opts ...dedupesvc.Option) { cfg.serviceDefaults = opts }

package incident

import "time"

// Stall makes every call of a replay wait d before it runs, as on a machine
// whose CPUs other processes take.
func Stall(cfg *Config, d time.Duration) { cfg.stall = d }

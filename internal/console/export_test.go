package console

import "time"

// SampleActivity makes c's sampler read the service's counters now, as its
// next tick would: tests see an interval without waiting for one.
func SampleActivity(c *Console) { c.activity.sample(time.Now()) }

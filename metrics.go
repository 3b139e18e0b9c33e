package idemgate

// StageBuckets are the upper bounds, in seconds, of every gate's
// stage-latency histogram (idemgate_interceptor_stage_seconds and its
// siblings): from a fingerprint's microseconds to a slow handler.
var StageBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1, 2.5, 10}

// ReplayAgeBuckets are the upper bounds, in seconds, of every gate's
// replay-age histogram (idemgate_interceptor_replay_age_seconds and its
// siblings): from a duplicate that raced its original (10ms) to one a week
// later, past the longest retention the Dedupe service allows by default.
var ReplayAgeBuckets = []float64{0.01, 0.1, 1, 10, 60, 300, 1800, 3600, 6 * 3600, 24 * 3600, 7 * 24 * 3600}

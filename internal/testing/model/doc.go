// Package model holds no Go code: reservation.pml is a Promela model of the
// reservation protocol (Begin, heartbeats, Finish, Release, Resolve, takeover,
// outcome-unknown, lease clocks, the resume mark after an outage, retention
// and the sweeper, the replay cache's stored-at time) that `make model`
// checks with SPIN, with each fixed hole available as a HOLE_* switch the
// check must catch; check.sh runs one check, printing its progress and times.
// Its header states the timing assumptions left and what
// in the code enforces each.
package model

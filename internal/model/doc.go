// Package model holds no Go code: reservation.pml is a Promela model of the
// reservation protocol (Begin, heartbeats, Finish, Release, Resolve, takeover,
// outcome-unknown, lease clocks) that `make model` checks with SPIN, with each
// fixed hole available as a HOLE_* switch the check must catch.
package model

package pgstore

import (
	"context"
	"time"
)

// QueuedForTest returns how many statements wait for the group commit.
func (s *Store) QueuedForTest() int { return s.group.Queued() }

// WritingForTest returns how many statements the group commit writes now.
func (s *Store) WritingForTest() int { return s.group.Writing() }

// HoldMarkForTest makes every MarkResumed of s call hook, with the mark's
// context, before its statement.
func HoldMarkForTest(s *Store, hook func(context.Context)) { s.markHook = hook }

// WaitingForMarkForTest returns how many operations of s wait for a pending
// MarkResumed.
func WaitingForMarkForTest(s *Store) int { return int(s.markWaiting.Load()) }

// FirstSQLForTest is Begin's first statement, for tests that run it inside
// a transaction of their own, as a batch does.
var FirstSQLForTest = firstSQL

// DeleteExpiredSQLForTest is the sweeper's statement.
var DeleteExpiredSQLForTest = deleteExpiredSQL

// FinishSQLForTest is s's Finish statement (with its NOTIFY when on).
func (s *Store) FinishSQLForTest() string { return s.finishSQL }

// ProbeEveryForTest sets how long l's probe may take before it warns.
func ProbeEveryForTest(l *Listener, d time.Duration) { l.probeEvery = d }

// UnreachableForTest says whether err means the database could not be
// reached.
var UnreachableForTest = unreachable

// ResumeBackoffCapForTest is the longest a replica waits between tries of
// a store it could not reach.
const ResumeBackoffCapForTest = resumeBackoffCap

// VacuumUsageForTest runs what a compaction runs once it has moved
// usageVacuumEvery changes: vacuumUsage.
func (s *Store) VacuumUsageForTest(ctx context.Context) { s.vacuumUsage(ctx) }

// VacuumRefusedForTest says whether err means the database will never let
// this role vacuum the usage changes.
var VacuumRefusedForTest = vacuumRefused

-- 009: the index the sweeper finds dead FAIL_CLOSED holders' records
-- through (see 008), in a transaction of its own.
--
-- The sweeper marks those records outcome-unknown, so operators and the
-- unknown-records gauge see them. Only in-flight rows of FAIL_CLOSED
-- reservations have an entry (a REEXECUTE row, dead or alive, has none, so
-- a sweep never rereads those): as many as such calls in flight. The key is
-- created_at, which a heartbeat never changes: an index on the lease's end
-- would make every heartbeat a non-HOT update (a new index entry per
-- renewal, in every index); with this one a heartbeat stays HOT when its
-- page has room. The sweeper filters by each row's effective lease end.
--
-- Building it scans the table once, under a SHARE lock: writes wait
-- meanwhile, reads go on. On a large table create it beforehand, with the
-- column of 008, under these names, and this file skips it:
--   ALTER TABLE idemgate_records ADD COLUMN IF NOT EXISTS unknown_retention_ms bigint NOT NULL DEFAULT 0;
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS idemgate_records_lost_outcomes_idx
--       ON idemgate_records (created_at) WHERE state = 'in_flight' AND unknown_retention_ms > 0;
-- Safe to re-run.
CREATE INDEX IF NOT EXISTS idemgate_records_lost_outcomes_idx
    ON idemgate_records (created_at) WHERE state = 'in_flight' AND unknown_retention_ms > 0;

-- A development database that ran 008 before it was released has that
-- version's index on lease_expires_at, which costs every heartbeat its HOT
-- update; nothing reads it any more. Last: DROP INDEX takes ACCESS
-- EXCLUSIVE on the table, briefly, and only where the index exists.
DROP INDEX IF EXISTS idemgate_records_in_flight_idx;

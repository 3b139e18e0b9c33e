-- 008: a dead FAIL_CLOSED holder's record stays outcome-unknown for the
-- unknown retention, and a key's epochs never repeat.
--
-- A holder that dies leaves its record in flight. Before this migration it
-- became outcome-unknown only if some Begin read it between its lease's end
-- and its expiry; otherwise it simply expired, a retry ran the side effect
-- again and the sweeper deleted it without a warning. Now each record keeps
-- the unknown retention its FAIL_CLOSED holder was granted, and an in-flight
-- record counts as present (and as outcome-unknown once its lease ran out)
-- until that long past its lease's end (see pgstore's expiry). Every
-- statement is safe to re-run.

-- unknown_retention_ms is how long past its lease's end an in-flight record
-- is kept, outcome-unknown, when its holder never stores an outcome: the
-- service's unknown retention for a FAIL_CLOSED reservation, 0 for a
-- REEXECUTE one. Rows written before this migration, and by a replica not
-- yet upgraded during a rolling deploy, read 0: they expire as they did.
-- A constant default rewrites no rows.
ALTER TABLE idemgate_records ADD COLUMN IF NOT EXISTS unknown_retention_ms bigint NOT NULL DEFAULT 0;

-- idemgate_epochs hands out every epoch (a fresh reservation, a takeover, a
-- Resolve, a forget): epochs are unique across the store and only grow, so
-- a key whose record was swept and is reserved again never hands its new
-- holder the fencing token of an earlier one (a stalled holder and its
-- successor). It starts above every epoch stored, and a re-run never moves
-- it back. Epochs of records swept before the upgrade are gone and cannot
-- be counted; a replica not yet upgraded keeps counting per key (from 1)
-- until it is.
CREATE SEQUENCE IF NOT EXISTS idemgate_epochs;
-- An empty store's first epoch is 1, as before; otherwise the next one is
-- above the highest stored and above the last handed out.
SELECT CASE WHEN stored = 0 AND NOT is_called THEN setval('idemgate_epochs', 1, false)
            ELSE setval('idemgate_epochs', greatest(stored, last_value), true) END
FROM (SELECT (SELECT coalesce(max(epoch), 0) FROM idemgate_records) AS stored, last_value, is_called
      FROM idemgate_epochs) AS seq;

-- The sweeper marks dead FAIL_CLOSED holders' records outcome-unknown, so
-- operators and the unknown-records gauge see them; it finds them through
-- this partial index of in-flight rows by lease end: a range of the rows
-- whose lease ended, never a scan of the table. Only in-flight rows (the
-- calls running now) have an entry. Building it scans the table once while
-- writes wait; on a large table, create it beforehand with CREATE INDEX
-- CONCURRENTLY under this name, and this migration skips it.
CREATE INDEX IF NOT EXISTS idemgate_records_in_flight_idx
    ON idemgate_records (lease_expires_at) WHERE state = 'in_flight';

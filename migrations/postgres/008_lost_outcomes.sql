-- 008: a dead FAIL_CLOSED holder's record stays outcome-unknown for the
-- unknown retention, and a key's epochs never repeat.
--
-- A holder that dies leaves its record in flight. Before this migration it
-- became outcome-unknown only if some Begin read it between its lease's end
-- and its expiry; otherwise it simply expired, a retry ran the side effect
-- again and the sweeper deleted it without a warning. Now each record keeps
-- the unknown retention its FAIL_CLOSED holder was granted, and an in-flight
-- record counts as present (and as outcome-unknown once its lease ran out)
-- until that long past its lease's end (see pgstore's expiry). Both hold
-- once every replica runs this version: during a rolling deploy a replica
-- not yet upgraded that takes a key over leaves the previous holder's
-- unknown_retention_ms on the row, and its sweeper deletes a dead
-- FAIL_CLOSED holder's record at expires_at, without the warning.
--
-- Locks: the whole file is one transaction, and a lock is held until it
-- commits, so the ACCESS EXCLUSIVE lock of ALTER TABLE (which stops reads
-- too) comes last, after the full scan for the highest epoch (which stops
-- nothing); it then only edits the catalog. The sweeper's index is built by
-- 009, in a transaction of its own. Every statement is safe to re-run.

-- idemgate_epochs hands out every epoch (a fresh reservation, a takeover, a
-- Resolve, a forget): epochs are unique across the store and only grow, so
-- a key whose record was swept and is reserved again never hands its new
-- holder the fencing token of an earlier one (a stalled holder and its
-- successor). It starts above every epoch stored, and a re-run never moves
-- it back. Epochs of records swept before the upgrade are gone and cannot
-- be counted; a replica not yet upgraded keeps counting per key (from 1 for
-- a fresh record, its row's epoch + 1 otherwise), unseen by the sequence,
-- until it is: upgraded replicas then give a row they update an epoch above
-- the row's (pgstore's nextEpochOf), never a lower one.
CREATE SEQUENCE IF NOT EXISTS idemgate_epochs;
-- An empty store's first epoch is 1, as before; otherwise the next one is
-- above the highest stored and above the last handed out.
SELECT CASE WHEN stored = 0 AND NOT is_called THEN setval('idemgate_epochs', 1, false)
            ELSE setval('idemgate_epochs', greatest(stored, last_value), true) END
FROM (SELECT (SELECT coalesce(max(epoch), 0) FROM idemgate_records) AS stored, last_value, is_called
      FROM idemgate_epochs) AS seq;

-- unknown_retention_ms is how long past its lease's end an in-flight record
-- is kept, outcome-unknown, when its holder never stores an outcome: the
-- service's unknown retention for a FAIL_CLOSED reservation, 0 for a
-- REEXECUTE one. Rows written before this migration, and by a replica not
-- yet upgraded during a rolling deploy, read 0: they expire as they did.
-- A constant default rewrites no rows, so this is a catalog change. Last,
-- see Locks above.
ALTER TABLE idemgate_records ADD COLUMN IF NOT EXISTS unknown_retention_ms bigint NOT NULL DEFAULT 0;

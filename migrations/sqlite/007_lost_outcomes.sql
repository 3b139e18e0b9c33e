-- 007: a dead FAIL_CLOSED holder's record stays outcome-unknown for the
-- unknown retention, and a key's epochs never repeat (see
-- postgres/008_lost_outcomes.sql). SQLite has no ADD COLUMN IF NOT EXISTS:
-- like 006 this file runs once, in the same transaction as its row in
-- idemgate_schema_migrations. Adding a column with a constant default only
-- edits the schema.

-- How long past its lease's end an in-flight record is kept, outcome-unknown,
-- when its FAIL_CLOSED holder never stores an outcome; 0 for REEXECUTE and
-- for records written before.
ALTER TABLE idemgate_records ADD COLUMN unknown_retention_ms INTEGER NOT NULL DEFAULT 0;

-- last_epoch is the highest epoch the store ever handed out; every new one
-- is last_epoch + 1, kept by the triggers below in the same statement as the
-- row, so a key whose record was swept never gets an earlier epoch again.
-- It starts at the highest epoch stored.
ALTER TABLE idemgate_store_state ADD COLUMN last_epoch INTEGER NOT NULL DEFAULT 0;
UPDATE idemgate_store_state
SET last_epoch = max(last_epoch, coalesce((SELECT max(epoch) FROM idemgate_records), 0));

CREATE TRIGGER IF NOT EXISTS idemgate_records_epoch_insert AFTER INSERT ON idemgate_records
BEGIN
    UPDATE idemgate_store_state SET last_epoch = max(last_epoch, NEW.epoch);
END;
CREATE TRIGGER IF NOT EXISTS idemgate_records_epoch_update AFTER UPDATE OF epoch ON idemgate_records
BEGIN
    UPDATE idemgate_store_state SET last_epoch = max(last_epoch, NEW.epoch);
END;

-- The sweeper finds dead FAIL_CLOSED holders' records to mark
-- outcome-unknown through this partial index: only in-flight records of
-- FAIL_CLOSED reservations have an entry (the calls running now; REEXECUTE
-- records, dead or alive, none), keyed by created_at, which a heartbeat
-- never changes, so a renewal never moves an entry (see
-- postgres/009_lost_outcomes_index.sql).
CREATE INDEX IF NOT EXISTS idemgate_records_lost_outcomes_idx
    ON idemgate_records (created_at) WHERE state = 'in_flight' AND unknown_retention_ms > 0;

-- 002: the outcome-unknown state.
--
-- A reservation whose lease ran out before its attempt stored an outcome may
-- or may not have run its side effect. Under the FAIL_CLOSED policy the record
-- becomes 'unknown': it blocks its key until an operator or a reconciler
-- resolves it, instead of silently running the side effect again.
-- Dropping and re-adding the check is safe to re-run and works on CockroachDB.
ALTER TABLE idemgate_records DROP CONSTRAINT IF EXISTS idemgate_records_state_check;
ALTER TABLE idemgate_records ADD CONSTRAINT idemgate_records_state_check
    CHECK (state IN ('in_flight', 'completed', 'released', 'unknown'));

-- Operators list unknown records first (idemctl); a partial index keeps that
-- a scan of the few unknown rows, not of the whole table.
CREATE INDEX IF NOT EXISTS idemgate_records_unknown_idx
    ON idemgate_records (expires_at) WHERE state = 'unknown';

-- waiters is set by a duplicate that waits for this record's outcome. Only
-- then does the change that settles it send a NOTIFY: NOTIFY serializes
-- committing transactions, so announcing every Finish would cost every
-- caller for the sake of the rare one that waits.
ALTER TABLE idemgate_records ADD COLUMN IF NOT EXISTS waiters boolean NOT NULL DEFAULT false;

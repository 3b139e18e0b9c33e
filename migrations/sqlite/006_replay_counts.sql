-- 006: each record counts its replays and keeps when it was last replayed
-- (see postgres/007_replay_counts.sql). Times are Unix milliseconds of the
-- service's clock, like the other columns. SQLite has no ADD COLUMN IF NOT
-- EXISTS: like 005 this file runs once, in the same transaction as its row
-- in idemgate_schema_migrations. Adding a column only edits the schema; older
-- records read 0 and NULL.
ALTER TABLE idemgate_records ADD COLUMN replay_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idemgate_records ADD COLUMN last_replayed_at INTEGER;

-- The replay listings' orders, for replayed records only (partial indexes:
-- a record never replayed has no entry).
CREATE INDEX IF NOT EXISTS idemgate_records_replays_idx
    ON idemgate_records (-replay_count, namespace, scope, idempotency_key)
    WHERE replay_count > 0;
CREATE INDEX IF NOT EXISTS idemgate_records_replay_age_idx
    ON idemgate_records (completed_at - last_replayed_at, namespace, scope, idempotency_key)
    WHERE replay_count > 0;

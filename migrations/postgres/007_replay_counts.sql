-- 007: each record counts its replays and keeps when it was last replayed,
-- so an operator sees every suppressed duplicate (idemctl show, list -sort).
--
-- Begin never writes on a replay: the Dedupe service counts replays in
-- memory and adds them here in one batched UPDATE per flush (AddReplays), so
-- the counts are a lower bound. Every statement is safe to re-run.

-- replay_count and last_replayed_at belong to the outcome stored at
-- completed_at. A key that expires and is reserved anew keeps the columns
-- of its earlier outcome (the reserving upsert does not reset them), so
-- readers count them only while last_replayed_at >= completed_at: a replay
-- of the earlier outcome was served before the new one was stored. Adding a
-- column with a constant default, or without one, rewrites no rows: the
-- ALTERs take the table lock for an instant. Older records read 0 and NULL.
ALTER TABLE idemgate_records ADD COLUMN IF NOT EXISTS replay_count bigint NOT NULL DEFAULT 0;
ALTER TABLE idemgate_records ADD COLUMN IF NOT EXISTS last_replayed_at timestamptz;

-- The replay listings (most replayed first; longest from completion to the
-- last replay first) read these in order, a page at a time, resuming after
-- the last row shown. Partial indexes hold replayed records only, so a
-- record never replayed (nearly all) costs no index entry on insert or
-- update. Building them scans the table once while writes wait; on a large
-- table, create them beforehand with CREATE INDEX CONCURRENTLY under these
-- names, and this migration skips them.
CREATE INDEX IF NOT EXISTS idemgate_records_replays_idx
    ON idemgate_records ((-replay_count), namespace, scope, idempotency_key)
    WHERE replay_count > 0;
CREATE INDEX IF NOT EXISTS idemgate_records_replay_age_idx
    ON idemgate_records ((completed_at - last_replayed_at), namespace, scope, idempotency_key)
    WHERE replay_count > 0;

-- 010: quota bookkeeping off the reserving transaction.
--
-- Until now the usage triggers (005) added each change to a counter row of
-- idemgate_namespace_usage in the same transaction as the record, so every
-- fresh key updated two counter rows and held their locks until commit:
-- writers that shared a shard row queued behind each other's commits, and a
-- batch holding a shard row could deadlock with a lone Begin waiting for the
-- same row. Now the triggers append each change to idemgate_usage_changes, a
-- table without indexes that no statement updates, so recording a change
-- takes no lock anyone else waits for. Compaction (pgstore's CompactUsage,
-- run by every Dedupe service about once a second, one replica at a time)
-- moves the changes into idemgate_namespace_usage in one transaction:
-- nothing is counted twice or lost, and the totals are exact once compacted.
-- Begin still reads idemgate_namespace_usage, so a caller's usage is seen up
-- to one compaction late: the quotas, soft by design, may be overshot by
-- what a caller reserves in that time (README, "Quotas").
--
-- Replicas not yet upgraded during a rolling deploy read the same totals and
-- their writes go through the same (replaced) trigger function, so they are
-- counted too. Every statement is safe to re-run. Going back to a version
-- before this file: those binaries never compact, so run
-- TRUNCATE idemgate_usage_changes; and then 005 again, which restores the
-- counting function and recounts from the records (README, "Limits per
-- caller"). Re-running 005 without the TRUNCATE, on a version that compacts,
-- would count the pending changes twice.

CREATE TABLE IF NOT EXISTS idemgate_usage_changes (
    namespace     text   NOT NULL,
    records       bigint NOT NULL,
    outcome_bytes bigint NOT NULL
);

-- The row compactions lock (FOR UPDATE SKIP LOCKED), so that one replica
-- compacts at a time and the others skip the round instead of queueing.
CREATE TABLE IF NOT EXISTS idemgate_usage_compaction (
    id boolean PRIMARY KEY DEFAULT true CHECK (id)
);
INSERT INTO idemgate_usage_compaction (id) VALUES (true) ON CONFLICT (id) DO NOTHING;

-- The same changes as 005's function counted, appended instead of added.
CREATE OR REPLACE FUNCTION idemgate_count_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO idemgate_usage_changes VALUES (NEW.namespace, 1, coalesce(octet_length(NEW.outcome_value), 0));
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO idemgate_usage_changes VALUES (OLD.namespace, -1, -coalesce(octet_length(OLD.outcome_value), 0));
    ELSE
        INSERT INTO idemgate_usage_changes
        VALUES (NEW.namespace, 0, coalesce(octet_length(NEW.outcome_value), 0) - coalesce(octet_length(OLD.outcome_value), 0));
    END IF;
    RETURN NULL;
END
$$;

-- Fold 005's shards into shard 0, so that Begin reads one row per
-- namespace. Compaction only ever writes shard 0.
WITH folded AS (
    DELETE FROM idemgate_namespace_usage WHERE shard <> 0
    RETURNING namespace, records, outcome_bytes
)
INSERT INTO idemgate_namespace_usage AS u (namespace, shard, records, outcome_bytes)
SELECT namespace, 0, sum(records), sum(outcome_bytes) FROM folded GROUP BY namespace ORDER BY namespace
ON CONFLICT (namespace, shard) DO UPDATE
SET records = u.records + excluded.records, outcome_bytes = u.outcome_bytes + excluded.outcome_bytes;

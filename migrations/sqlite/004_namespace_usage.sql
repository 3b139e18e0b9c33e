-- 004: per-namespace usage, for the live-records and stored-bytes quotas (see
-- postgres/005_namespace_usage.sql). Triggers keep running totals in the same
-- statement as the change, so Begin reads one row instead of counting a
-- caller's records. SQLite has one writer, so one row per namespace does not
-- queue anyone. Every statement is safe to re-run.

CREATE TABLE IF NOT EXISTS idemgate_namespace_usage (
    namespace     TEXT    PRIMARY KEY,
    -- rows, expired ones included until the sweeper deletes them.
    records       INTEGER NOT NULL DEFAULT 0,
    -- the sum of length(outcome_value), the bulk of a row.
    outcome_bytes INTEGER NOT NULL DEFAULT 0
);

-- +1 row and its outcome's size on insert.
CREATE TRIGGER IF NOT EXISTS idemgate_records_usage_insert AFTER INSERT ON idemgate_records
BEGIN
    INSERT INTO idemgate_namespace_usage (namespace, records, outcome_bytes)
    VALUES (NEW.namespace, 1, coalesce(length(NEW.outcome_value), 0))
    ON CONFLICT (namespace) DO UPDATE
    SET records = records + 1, outcome_bytes = outcome_bytes + excluded.outcome_bytes;
END;

-- -1 row and its outcome's size on delete (the sweeper).
CREATE TRIGGER IF NOT EXISTS idemgate_records_usage_delete AFTER DELETE ON idemgate_records
BEGIN
    UPDATE idemgate_namespace_usage
    SET records = records - 1, outcome_bytes = outcome_bytes - coalesce(length(OLD.outcome_value), 0)
    WHERE namespace = OLD.namespace;
END;

-- The change in outcome size when an update sets outcome_value (reserve,
-- Finish, Resolve); heartbeats and state flips do not fire it.
CREATE TRIGGER IF NOT EXISTS idemgate_records_usage_update AFTER UPDATE OF outcome_value ON idemgate_records
WHEN coalesce(length(OLD.outcome_value), 0) <> coalesce(length(NEW.outcome_value), 0)
BEGIN
    UPDATE idemgate_namespace_usage
    SET outcome_bytes = outcome_bytes + coalesce(length(NEW.outcome_value), 0) - coalesce(length(OLD.outcome_value), 0)
    WHERE namespace = NEW.namespace;
END;

-- Start from the rows already there; a re-run recounts.
DELETE FROM idemgate_namespace_usage;
INSERT INTO idemgate_namespace_usage (namespace, records, outcome_bytes)
SELECT namespace, count(*), coalesce(sum(length(outcome_value)), 0)
FROM idemgate_records
GROUP BY namespace;

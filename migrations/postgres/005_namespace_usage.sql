-- 005: per-namespace usage, for the live-records and stored-bytes quotas.
--
-- Begin refuses a caller past its quota; it must learn the caller's usage
-- without counting its rows (a COUNT or SUM over one namespace's index range
-- costs time in proportion to its records, on every new reservation).
-- Instead triggers keep running totals, in the same statement as the change,
-- so they never drift from the rows. Every statement is safe to re-run.

-- One namespace's totals are spread over up to 16 shard rows, chosen by the
-- writing connection (pg_backend_pid() % 16): concurrent writers of one
-- busy caller then rarely queue on the same row lock until commit. A delete
-- may decrement another shard than the insert incremented; only the sum over
-- a namespace's shards means anything, and that is exact.
CREATE TABLE IF NOT EXISTS idemgate_namespace_usage (
    namespace     text     NOT NULL,
    shard         smallint NOT NULL,
    -- records counts rows, expired ones included until the sweeper deletes
    -- them: they take space until then.
    records       bigint   NOT NULL DEFAULT 0,
    -- outcome_bytes sums octet_length(outcome_value), the bulk of a row.
    outcome_bytes bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, shard)
);

-- The trigger function: +1 row on insert, -1 on delete, and the change in
-- outcome size on insert, delete and update.
CREATE OR REPLACE FUNCTION idemgate_count_usage() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ns    text;
    rows  bigint := 0;
    bytes bigint := 0;
BEGIN
    IF TG_OP = 'INSERT' THEN
        ns := NEW.namespace; rows := 1; bytes := coalesce(octet_length(NEW.outcome_value), 0);
    ELSIF TG_OP = 'DELETE' THEN
        ns := OLD.namespace; rows := -1; bytes := -coalesce(octet_length(OLD.outcome_value), 0);
    ELSE
        ns := NEW.namespace;
        bytes := coalesce(octet_length(NEW.outcome_value), 0) - coalesce(octet_length(OLD.outcome_value), 0);
    END IF;
    INSERT INTO idemgate_namespace_usage AS u (namespace, shard, records, outcome_bytes)
    VALUES (ns, pg_backend_pid() % 16, rows, bytes)
    ON CONFLICT (namespace, shard) DO UPDATE
    SET records = u.records + excluded.records, outcome_bytes = u.outcome_bytes + excluded.outcome_bytes;
    RETURN NULL;
END
$$;

-- Inserts and deletes always count. Updates count only when they set
-- outcome_value (reserve, Finish, Resolve) and its size changes, so
-- heartbeats and state flips cost nothing extra.
DROP TRIGGER IF EXISTS idemgate_records_usage_rows ON idemgate_records;
CREATE TRIGGER idemgate_records_usage_rows
    AFTER INSERT OR DELETE ON idemgate_records
    FOR EACH ROW EXECUTE FUNCTION idemgate_count_usage();
DROP TRIGGER IF EXISTS idemgate_records_usage_bytes ON idemgate_records;
CREATE TRIGGER idemgate_records_usage_bytes
    AFTER UPDATE OF outcome_value ON idemgate_records
    FOR EACH ROW
    WHEN (octet_length(OLD.outcome_value) IS DISTINCT FROM octet_length(NEW.outcome_value))
    EXECUTE FUNCTION idemgate_count_usage();

-- Start from the rows already there: one scan, now, instead of one per
-- Begin. A re-run recounts (shard 0 takes the total, the other shards are
-- cleared). Rows written by a replica of the previous version while this
-- runs may be missed; the quotas are limits against runaway callers, not
-- exact accounting.
DELETE FROM idemgate_namespace_usage;
INSERT INTO idemgate_namespace_usage (namespace, shard, records, outcome_bytes)
SELECT namespace, 0, count(*), coalesce(sum(octet_length(outcome_value)), 0)
FROM idemgate_records
GROUP BY namespace;

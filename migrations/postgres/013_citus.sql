-- 013: the schema distributed over a Citus cluster; nothing on plain
-- PostgreSQL.
--
-- Only where the citus extension is installed in this database (the
-- coordinator of a Citus cluster: docs/operating.md, "When one primary is
-- not enough") does this distribute the tables, once; elsewhere, and on a
-- re-run, it does nothing.
--
-- - idemgate_records is hash-distributed by idempotency_key: every statement
--   of a call names its key, so each goes to the one shard holding it.
-- - idemgate_usage_changes gets the key of the record whose change it holds
--   and is distributed by it, co-located with the records: a change lands
--   on the shard of its record, on the same worker.
-- - The usage triggers (005, 010) stay (dropped while the rows are copied
--   to the shards, which the totals already count). Citus refuses to
--   distribute a table with triggers unless citus.enable_unsafe_triggers
--   is on while it does, because a trigger on a shard may query other
--   shards. These insert only
--   the change of their own row, under its key, so the insert goes to the
--   co-located shard on the same worker, in the same transaction; and a
--   trigger on a shard may run only such local tasks (Citus errors on a
--   remote one instead of running it apart from the transaction). A change
--   is therefore committed exactly with its row, as on one server
--   (pgstore's citus_test proves it on a 2-worker cluster).
-- - The small tables every statement reads (idemgate_store_state,
--   idemgate_namespace_usage) and the compaction lock row are reference
--   tables: a copy on every node, so a query on one shard joins them there.
-- - idemgate_plus_ms adds milliseconds to a time. Citus refuses STABLE
--   functions applied to columns in UPDATE and DELETE; timestamptz +
--   interval is STABLE because a day or month depends on the time zone,
--   and milliseconds never do, so this is IMMUTABLE and pgstore's Citus
--   statements use it (WithCitus).
--
-- An existing single-node schema is distributed the same way: its rows are
-- copied to the shards and the coordinator's local copies then emptied.
-- That holds every write for the copy: stop the Dedupe services first.
-- The sequence idemgate_epochs stays on the coordinator, which evaluates
-- nextval for every statement.
DO $citus$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'idemgate_records'::regclass) THEN
        RETURN;
    END IF;

    CREATE OR REPLACE FUNCTION idemgate_plus_ms(ts timestamptz, ms bigint) RETURNS timestamptz
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        AS $f$ SELECT ts + ms * interval '1 millisecond' $f$;
    PERFORM create_distributed_function('idemgate_plus_ms(timestamptz,bigint)');
    -- Citus refuses a CASE holding a STABLE function (now()) in UPDATE and
    -- DELETE; this is CASE WHEN c THEN a ELSE b END as a function, whose
    -- arguments the coordinator evaluates first. PL/pgSQL: PostgreSQL
    -- would inline an SQL function back into the CASE Citus refuses.
    CREATE OR REPLACE FUNCTION idemgate_case(c boolean, a anycompatible, b anycompatible) RETURNS anycompatible
        LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
        AS $f$ BEGIN IF c THEN RETURN a; END IF; RETURN b; END $f$;
    PERFORM create_distributed_function('idemgate_case(boolean,anycompatible,anycompatible)');

    ALTER TABLE idemgate_usage_changes ADD COLUMN IF NOT EXISTS idempotency_key text NOT NULL DEFAULT '';
    -- The function runs on the workers, in sessions whose search_path is
    -- not this schema's: it names its schema itself.
    EXECUTE format($fn$
    CREATE OR REPLACE FUNCTION idemgate_count_usage() RETURNS trigger LANGUAGE plpgsql SET search_path = %I AS $f$
    BEGIN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO idemgate_usage_changes (namespace, records, outcome_bytes, idempotency_key)
            VALUES (NEW.namespace, 1, coalesce(octet_length(NEW.outcome_value), 0), NEW.idempotency_key);
        ELSIF TG_OP = 'DELETE' THEN
            INSERT INTO idemgate_usage_changes (namespace, records, outcome_bytes, idempotency_key)
            VALUES (OLD.namespace, -1, -coalesce(octet_length(OLD.outcome_value), 0), OLD.idempotency_key);
        ELSE
            INSERT INTO idemgate_usage_changes (namespace, records, outcome_bytes, idempotency_key)
            VALUES (NEW.namespace, 0, coalesce(octet_length(NEW.outcome_value), 0) - coalesce(octet_length(OLD.outcome_value), 0),
                    NEW.idempotency_key);
        END IF;
        RETURN NULL;
    END
    $f$ $fn$, current_schema());

    -- The triggers come off while the rows are copied to the shards (the
    -- totals already count them) and back on afterwards, on every shard.
    DROP TRIGGER IF EXISTS idemgate_records_usage_rows ON idemgate_records;
    DROP TRIGGER IF EXISTS idemgate_records_usage_bytes ON idemgate_records;
    SET LOCAL citus.enable_unsafe_triggers = on;
    PERFORM create_reference_table('idemgate_store_state');
    PERFORM create_reference_table('idemgate_namespace_usage');
    PERFORM create_reference_table('idemgate_usage_compaction');
    PERFORM create_distributed_table('idemgate_records', 'idempotency_key');
    PERFORM create_distributed_table('idemgate_usage_changes', 'idempotency_key', colocate_with => 'idemgate_records');
    PERFORM truncate_local_data_after_distributing_table('idemgate_store_state');
    PERFORM truncate_local_data_after_distributing_table('idemgate_namespace_usage');
    PERFORM truncate_local_data_after_distributing_table('idemgate_usage_compaction');
    PERFORM truncate_local_data_after_distributing_table('idemgate_records');
    PERFORM truncate_local_data_after_distributing_table('idemgate_usage_changes');
    CREATE TRIGGER idemgate_records_usage_rows
        AFTER INSERT OR DELETE ON idemgate_records
        FOR EACH ROW EXECUTE FUNCTION idemgate_count_usage();
    CREATE TRIGGER idemgate_records_usage_bytes
        AFTER UPDATE OF outcome_value ON idemgate_records
        FOR EACH ROW
        WHEN (octet_length(OLD.outcome_value) IS DISTINCT FROM octet_length(NEW.outcome_value))
        EXECUTE FUNCTION idemgate_count_usage();
END
$citus$;

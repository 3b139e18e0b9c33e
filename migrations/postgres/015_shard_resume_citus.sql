-- 015: on a Citus cluster, the resume mark kept per shard, on the worker
-- holding the shard, so a worker's outage stops only the keys of that
-- worker; nothing on plain PostgreSQL.
--
-- A replica that saw the store unreachable holds every statement until its
-- mark of the resume commits (pgstore's resume), so holders whose renewals
-- the outage refused keep their keys one more lease (leaseEnd). Written to
-- the reference table idemgate_store_state, the mark is a write on every
-- node: with one worker down it failed, and the replica's statements on
-- every worker's keys with it (issue 38 item 4).
--
-- Only where the citus extension is installed, after 013 distributed the
-- records; run again by Migrate with 013 and 014 when a single-node schema
-- is distributed later (its name ends in _citus.sql). Safe to re-run.
DO $citus$
BEGIN
    -- Two IFs: one expression naming pg_dist_partition fails where citus
    -- is not installed, whatever the first test says.
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'idemgate_records'::regclass) THEN
        RETURN;
    END IF;

    -- idemgate_shard_resumed_plus_ms(key, ms) is the latest resume mark of
    -- the shard of key plus ms milliseconds (NULL when the shard has none),
    -- read from the marks' shard on the worker it runs on. Called with the
    -- record's columns, Citus runs it on the worker holding the record, in
    -- every statement (as 014's function): the marks' shard of the same
    -- shard index is there (co-location). It reads that shard table by name,
    -- a local read: a query on the distributed table from a worker would be
    -- planned across the shards. IMMUTABLE for the reason 014 gives (Citus
    -- refuses STABLE functions of columns in UPDATE, DELETE and ON CONFLICT;
    -- it is never given constants only). It names its schema itself: it
    -- runs in worker sessions whose search_path is not this schema's.
    -- Made before the table is distributed: Citus refuses a function
    -- command after a parallel operation on a distributed table in one
    -- transaction.
    EXECUTE format($fn$
    CREATE OR REPLACE FUNCTION idemgate_shard_resumed_plus_ms(key text, ms bigint) RETURNS timestamptz
        LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = %I
        AS $f$
        DECLARE
            at timestamptz;
        BEGIN
            EXECUTE 'SELECT max(resumed_at) FROM ' || shard_name('idemgate_resume_marks'::regclass,
                get_shard_id_for_distribution_column('idemgate_resume_marks'::regclass, key)) INTO at;
            RETURN at + ms * interval '1 millisecond';
        END
        $f$ $fn$, current_schema());
    PERFORM create_distributed_function('idemgate_shard_resumed_plus_ms(text,bigint)');

    -- A shard's resume marks: pgstore writes one row per shard, under a
    -- key of that shard, in a statement on that shard alone, so marking the
    -- shards of a worker needs that worker and the coordinator only.
    -- Co-located with the records, so a record's shard and its marks' shard
    -- are on one worker, and move together.
    CREATE TABLE IF NOT EXISTS idemgate_resume_marks (
        idempotency_key text PRIMARY KEY,
        resumed_at timestamptz NOT NULL
    );
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'idemgate_resume_marks'::regclass) THEN
        PERFORM create_distributed_table('idemgate_resume_marks', 'idempotency_key', colocate_with => 'idemgate_records');
    END IF;
END
$citus$;

-- 014: on a Citus cluster, the restart of the worker holding a record
-- counts in its lease's grace, as a restart of one PostgreSQL does;
-- nothing on plain PostgreSQL.
--
-- pgstore's effective lease end (leaseEnd) runs one full lease past the
-- database server's start (pg_postmaster_start_time()), so a holder that
-- could not renew while the database restarted keeps its key. On Citus,
-- UPDATE and DELETE evaluate that call on the coordinator (it reads no
-- column) and Begin's takeover is given the coordinator's as a parameter:
-- a worker killed and restarted while the coordinator stayed up granted
-- nothing to the holders whose renewals its outage refused.
--
-- idemgate_server_start_plus_ms(ms) is the start of the server it runs on
-- plus ms milliseconds. Called with a column (the record's lease_ms), it is
-- one Citus cannot evaluate on the coordinator, so it runs on the worker
-- holding the record's shard, in every statement. It is declared IMMUTABLE
-- although it is only stable within one server's life: Citus refuses
-- STABLE functions of columns in UPDATE, DELETE and an INSERT's
-- ON CONFLICT, and PostgreSQL folds an IMMUTABLE call into a constant only
-- when every argument is one, which pgstore never passes. PL/pgSQL, so it
-- is never inlined.
--
-- Only where the citus extension is installed; run again by Migrate with
-- 013 when a single-node schema is distributed later (its name ends in
-- _citus.sql).
DO $citus$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    CREATE OR REPLACE FUNCTION idemgate_server_start_plus_ms(ms bigint) RETURNS timestamptz
        LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
        AS $f$ BEGIN RETURN pg_postmaster_start_time() + ms * interval '1 millisecond'; END $f$;
    PERFORM create_distributed_function('idemgate_server_start_plus_ms(bigint)');
END
$citus$;

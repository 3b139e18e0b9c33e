-- 003: a lease does not run out while the store is away.
--
-- A holder cut off from the store (the database or the dedupe service down)
-- cannot renew its lease, so the first Begin after recovery must not take its
-- key over or mark it outcome-unknown. Each record keeps its lease's length,
-- and the store keeps when it last came back from an outage; a record's
-- effective lease end is the latest of its own end and one full lease past
-- that resume (see pgstore). Every statement is safe to re-run.

-- lease_ms is the length of the record's last lease (Begin or renewal), the
-- grace it gets after a resume. Rows written before this migration, and rows
-- a not yet upgraded replica writes during a rolling deploy, get the
-- interceptor's default lease of 10s; the default therefore stays.
ALTER TABLE idemgate_records ADD COLUMN IF NOT EXISTS lease_ms bigint NOT NULL DEFAULT 10000;

-- idemgate_store_state is one row: resumed_at is the last time the store came
-- back from an outage, by the database's clock (set by MarkResumed). The
-- boolean key with its check keeps it to one row, so reading it is a scalar
-- subquery on a one-page table.
CREATE TABLE IF NOT EXISTS idemgate_store_state (
    id         boolean     PRIMARY KEY DEFAULT true CHECK (id),
    resumed_at timestamptz NOT NULL
);

-- Seeded with the migration's time: the service that migrates is starting,
-- which counts as a resume. A re-run leaves the row as it is.
INSERT INTO idemgate_store_state (id, resumed_at) VALUES (true, now())
ON CONFLICT (id) DO NOTHING;

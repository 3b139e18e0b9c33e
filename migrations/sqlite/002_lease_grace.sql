-- 002: a lease does not run out while the store is away (see
-- postgres/003_lease_grace.sql). The embedded store marks itself resumed each
-- time it is opened. SQLite has no ADD COLUMN IF NOT EXISTS: this file runs
-- once, in the same transaction as its row in idemgate_schema_migrations.

-- lease_ms is the length of the record's last lease; rows written before this
-- migration get the interceptor's default lease of 10s.
ALTER TABLE idemgate_records ADD COLUMN lease_ms INTEGER NOT NULL DEFAULT 10000;

-- One row: resumed_at is the last time the store was opened, in Unix
-- milliseconds of the process's clock. Open sets it right after migrating.
CREATE TABLE IF NOT EXISTS idemgate_store_state (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    resumed_at INTEGER NOT NULL
);
INSERT OR IGNORE INTO idemgate_store_state (id, resumed_at) VALUES (1, 0);

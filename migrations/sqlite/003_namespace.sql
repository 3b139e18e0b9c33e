-- 003: the calling service's namespace is a column of its own (see
-- postgres/004_namespace.sql): caller "a\x1fb" with scope "c" and caller "a"
-- with scope "b\x1fc" shared one record when the namespace was a prefix of the
-- scope. SQLite cannot change a primary key in place, so the table is rebuilt.
-- Like 002 this file runs once, in the same transaction as its row in
-- idemgate_schema_migrations; a failure leaves the old table as it was.

-- A leftover of an interrupted run cannot exist (the transaction rolled it
-- back); dropping it anyway keeps a hand re-run from failing.
DROP TABLE IF EXISTS idemgate_records_new;

-- The table of 001 and 002 with namespace in front of the primary key.
CREATE TABLE idemgate_records_new (
    -- the authenticated caller's name, '' without authentication.
    namespace        TEXT    NOT NULL DEFAULT '',
    scope            TEXT    NOT NULL,
    idempotency_key  TEXT    NOT NULL,
    fingerprint      BLOB    NOT NULL,
    state            TEXT    NOT NULL
        CHECK (state IN ('in_flight', 'completed', 'released', 'unknown')),
    attempt_token    TEXT    NOT NULL,
    epoch            INTEGER NOT NULL,
    outcome_type_url TEXT,
    outcome_value    BLOB,
    retention_ms     INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    completed_at     INTEGER,
    lease_ms         INTEGER NOT NULL DEFAULT 10000,
    PRIMARY KEY (namespace, scope, idempotency_key),
    CHECK ((state = 'completed') = (outcome_value IS NOT NULL))
);

-- Every record, its joined scope's prefix moved into namespace: cut at the
-- first separator (char(31)) as the previous version's SplitScope did, so a
-- record written before is replayed to the same caller after the upgrade.
INSERT INTO idemgate_records_new (
    namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    outcome_type_url, outcome_value, retention_ms, lease_expires_at, expires_at,
    created_at, completed_at, lease_ms)
SELECT CASE WHEN instr(scope, char(31)) > 0 THEN substr(scope, 1, instr(scope, char(31)) - 1) ELSE '' END,
       substr(scope, instr(scope, char(31)) + 1),
       idempotency_key, fingerprint, state, attempt_token, epoch,
       outcome_type_url, outcome_value, retention_ms, lease_expires_at, expires_at,
       created_at, completed_at, lease_ms
FROM idemgate_records;

DROP TABLE idemgate_records;
ALTER TABLE idemgate_records_new RENAME TO idemgate_records;

-- The sweeper's index, dropped with the old table.
CREATE INDEX IF NOT EXISTS idemgate_records_expires_at_idx ON idemgate_records (expires_at);

-- 001: the table of idempotency records, for the embedded SQLite store.
--
-- The same ideas as postgres/: one row per (scope, idempotency_key) is the
-- reservation, taken by one upsert that commits before the handler runs.
-- Times are Unix milliseconds from the dedupe service's clock: the embedded
-- store serves one process, so there is one clock.
CREATE TABLE IF NOT EXISTS idemgate_records (
    scope            TEXT    NOT NULL,
    idempotency_key  TEXT    NOT NULL,
    -- SHA-256 of the request that first used the key.
    fingerprint      BLOB    NOT NULL,
    -- in_flight, completed, released or unknown (lease ran out, no outcome).
    state            TEXT    NOT NULL
        CHECK (state IN ('in_flight', 'completed', 'released', 'unknown')),
    attempt_token    TEXT    NOT NULL,
    -- grows on every new reservation of the key: fences stale holders.
    epoch            INTEGER NOT NULL,
    -- the stored google.protobuf.Any, as received.
    outcome_type_url TEXT,
    outcome_value    BLOB,
    retention_ms     INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    completed_at     INTEGER,
    PRIMARY KEY (scope, idempotency_key),
    CHECK ((state = 'completed') = (outcome_value IS NOT NULL))
);

-- The sweeper deletes expired rows oldest first, in bounded batches.
CREATE INDEX IF NOT EXISTS idemgate_records_expires_at_idx ON idemgate_records (expires_at);

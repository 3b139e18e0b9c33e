-- 001: the table of idempotency records.
--
-- One row per (scope, idempotency_key). The row is the reservation: it is
-- inserted (or taken over) by one single-statement transaction that commits
-- before the tool's handler runs, so no row lock is ever held across user code.
-- The SQL stays inside what CockroachDB and YugabyteDB also accept: no advisory
-- locks, no ctid, no table inheritance. Every statement is safe to re-run.

CREATE TABLE IF NOT EXISTS idemgate_records (
    -- scope namespaces the key (method and tenant), so keys never collide
    -- across methods or tenants.
    scope            text        NOT NULL,
    -- idempotency_key names one logical action within the scope.
    idempotency_key  text        NOT NULL,
    -- fingerprint is the SHA-256 of the request that first used the key; a
    -- different request under the same key is refused, never replayed.
    fingerprint      bytea       NOT NULL,
    -- state: 'in_flight' while an attempt holds the reservation, 'completed'
    -- once its outcome is stored, 'released' when it gave the key up.
    state            text        NOT NULL,
    -- attempt_token identifies the attempt that holds (or held) the row, so a
    -- retried Begin, Finish or Release from that attempt is recognised.
    attempt_token    text        NOT NULL,
    -- epoch increases on every new reservation of the key; Finish and Release
    -- name it, so a stale holder can never overwrite a newer attempt.
    epoch            bigint      NOT NULL,
    -- outcome_type_url and outcome_value are the stored google.protobuf.Any,
    -- kept as the exact bytes Finish received so replays are byte-identical.
    outcome_type_url text,
    outcome_value    bytea,
    -- retention_ms is how long the record is kept after Begin and again after
    -- Finish, so a completed outcome is replayed for the whole retention.
    retention_ms     bigint      NOT NULL,
    -- lease_expires_at is when an in-flight reservation counts as abandoned.
    lease_expires_at timestamptz NOT NULL,
    -- expires_at is when the record counts as absent; the sweeper deletes it
    -- after that.
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    PRIMARY KEY (scope, idempotency_key),
    CONSTRAINT idemgate_records_state_check
        CHECK (state IN ('in_flight', 'completed', 'released')),
    CONSTRAINT idemgate_records_outcome_check
        CHECK ((state = 'completed') = (outcome_value IS NOT NULL))
);

-- The sweeper deletes expired rows in bounded batches, oldest first; this
-- index keeps each batch an index range scan instead of a table scan.
CREATE INDEX IF NOT EXISTS idemgate_records_expires_at_idx
    ON idemgate_records (expires_at);

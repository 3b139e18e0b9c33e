-- 005: the id of the key an outcome is sealed under (see
-- postgres/006_outcome_key_id.sql); NULL for an outcome stored as received.
-- SQLite has no ADD COLUMN IF NOT EXISTS: like 002 and 003 this file runs
-- once, in the same transaction as its row in idemgate_schema_migrations.
-- Adding a nullable column only edits the schema; no row is rewritten.
ALTER TABLE idemgate_records ADD COLUMN outcome_key_id TEXT;

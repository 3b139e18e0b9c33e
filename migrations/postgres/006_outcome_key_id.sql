-- 006: the id of the key an outcome is sealed under (-outcome-keys-file).
--
-- NULL for an outcome stored as received: written before encryption was
-- turned on, or with it off. Kept per record, not per deployment, so that
-- rotating keys leaves older records readable with their own key, and so
-- that a sealed outcome is never taken for plaintext. Nullable with no
-- default: adding it rewrites no rows and takes the table lock only for an
-- instant. Safe to re-run.
ALTER TABLE idemgate_records ADD COLUMN IF NOT EXISTS outcome_key_id text;

-- 004: the calling service's namespace is a column of its own.
--
-- Records were keyed by scope alone, the caller's name joined in front of it
-- with a \x1f separator. Caller names and scopes were not checked for that
-- byte, so caller "a\x1fb" with scope "c" and caller "a" with scope "b\x1fc"
-- shared one record. Now the namespace is its own column and part of the
-- primary key: isolation no longer depends on what bytes a name holds. Every
-- statement is safe to re-run.
--
-- Upgrade every dedupe service replica together: a replica of the previous
-- version keeps writing joined scopes into namespace ''. Re-running this
-- migration (deleting its row in idemgate_schema_migrations) moves such rows
-- too.

-- namespace is the authenticated caller's name, '' without authentication.
ALTER TABLE idemgate_records ADD COLUMN IF NOT EXISTS namespace text NOT NULL DEFAULT '';

-- The old key would make the move below collide: the joined scope "a\x1fs"
-- becomes scope "s", which an unauthenticated record may already use. Drop
-- it first (the whole file is one transaction, so no one sees the table
-- without a key).
ALTER TABLE idemgate_records DROP CONSTRAINT IF EXISTS idemgate_records_pkey;

-- Move each joined scope's prefix into namespace, cut at the first separator
-- as the previous version's SplitScope did, so every record written before
-- keeps its caller and is replayed after the upgrade. A re-run finds no
-- separator left: the service now refuses control characters in scopes.
UPDATE idemgate_records
SET namespace = split_part(scope, chr(31), 1),
    scope = substr(scope, strpos(scope, chr(31)) + 1)
WHERE namespace = '' AND strpos(scope, chr(31)) > 0;

-- The new key: a caller's records are (namespace, scope, key), so no scope
-- can name another caller's record.
ALTER TABLE idemgate_records ADD CONSTRAINT idemgate_records_pkey
    PRIMARY KEY (namespace, scope, idempotency_key);

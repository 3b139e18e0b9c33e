-- 012: when each usage change was recorded, for the compaction lag.
--
-- Compaction (010) moves usage changes into the quota totals once a second
-- on every replica. Each change now carries the time of the transaction
-- that recorded it, so that a compaction round can first ask, without a
-- lock, whether anything waits and how old the oldest change is: a round
-- with nothing to move takes no row lock and writes nothing, and the age is
-- the service's idemgate_usage_compaction_lag_seconds. The triggers insert
-- three values, so the column's default fills it, for replicas not yet
-- upgraded too. Adding a column with a non-volatile default rewrites no
-- row. Safe to re-run; going back needs nothing (the column is ignored).

ALTER TABLE idemgate_usage_changes ADD COLUMN IF NOT EXISTS changed_at timestamptz NOT NULL DEFAULT now();

-- 011: Begin counts a caller's uncompacted usage changes.
--
-- Until now Begin checked the quotas against idemgate_namespace_usage only,
-- the totals as of the last compaction (010), so a caller could overshoot
-- its records quota by everything it reserved within one compaction
-- interval (1,000 concurrent Begins against a quota of 200 reserved all
-- 1,000). Begin now adds the caller's changes still waiting in
-- idemgate_usage_changes, which holds about one compaction interval's
-- changes; this index makes that one index range per Begin of a fresh key,
-- and costs each appended change one index entry (no lock anyone waits
-- for). A compaction moves changes into the totals in one transaction, so a
-- Begin's snapshot sees each change once: in the totals or in the table.
-- The quota is then overshot only by reservations committing at the same
-- moment (README, "Limits per caller"). Replicas not yet upgraded keep
-- checking the totals alone. Safe to re-run; going back needs nothing
-- (DROP INDEX idemgate_usage_changes_namespace; is optional).

CREATE INDEX IF NOT EXISTS idemgate_usage_changes_namespace ON idemgate_usage_changes (namespace);

-- Typing notices no longer go through fed_edu_outbox: the sender keeps them
-- in memory (one replayed after a restart or a long outage is wrong). Those
-- queued before and not yet taken into a transaction are stale by now; a
-- transaction already begun keeps what it carries (a retry sends the same).
DELETE FROM fed_edu_outbox WHERE ekey LIKE 'typing %' AND txn_id IS NULL;

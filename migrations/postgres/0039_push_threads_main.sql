-- The main timeline's totals and newest row are read from push_tally itself
-- (its newest row with thread ''), so an event there writes one row, not
-- two: push_threads keeps only real threads, whose list the unread window
-- walks.
DELETE FROM push_threads WHERE thread = '';

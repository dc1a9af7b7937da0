-- Unused /v1/create reservations per user: counted on every create (the cap
-- on pending uploads) and pruned once expired.
CREATE INDEX media_pending ON media (uploader, created_ts) WHERE uploaded = 0;

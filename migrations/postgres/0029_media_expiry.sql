-- Media that goes away by itself (the images URL previews store): when.
ALTER TABLE media ADD COLUMN expires_ts BIGINT;
CREATE INDEX media_expiry ON media (expires_ts) WHERE expires_ts IS NOT NULL;

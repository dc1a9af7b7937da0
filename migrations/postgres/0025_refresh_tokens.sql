-- Refresh tokens: an access token issued with one expires at
-- token_expires_ts (NULL: never); refresh_hash is the sha-256 of the
-- device's refresh token, prev_refresh_hash the one it replaced, still taken
-- until the new access token is used (the spec's rule for a lost answer).
ALTER TABLE devices ADD COLUMN token_expires_ts BIGINT;
ALTER TABLE devices ADD COLUMN refresh_hash TEXT;
ALTER TABLE devices ADD COLUMN prev_refresh_hash TEXT;
CREATE UNIQUE INDEX devices_by_refresh ON devices (refresh_hash);
CREATE INDEX devices_by_prev_refresh ON devices (prev_refresh_hash);

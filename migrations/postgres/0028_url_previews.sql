-- URL previews already made, served again until they expire.
CREATE TABLE url_previews (
    url TEXT PRIMARY KEY,
    preview TEXT NOT NULL,
    fetched_ts BIGINT NOT NULL,
    expires_ts BIGINT NOT NULL
);
CREATE INDEX url_previews_expiry ON url_previews (expires_ts);

-- Local media. The bytes live in files under <data_dir>/media; this is the
-- index. A row created by /v1/create has no content until it is uploaded.
CREATE TABLE media (
    media_id     TEXT PRIMARY KEY NOT NULL,
    uploader     TEXT NOT NULL,
    content_type TEXT,
    filename     TEXT,
    size         INTEGER,
    created_ts   INTEGER NOT NULL,
    uploaded     INTEGER NOT NULL DEFAULT 0
);

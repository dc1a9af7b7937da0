-- /sync: one global stream position over everything a sync can return, so a
-- since token is one number. Every event, receipt, account-data change and
-- to-device message takes the next position when it is written.
ALTER TABLE events ADD COLUMN stream BIGINT NOT NULL DEFAULT 0;
CREATE INDEX events_by_stream ON events (room_id, stream);

CREATE TABLE receipts (
    room_id      TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    receipt_type TEXT NOT NULL,
    -- '' for unthreaded receipts
    thread_id    TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    ts           BIGINT NOT NULL,
    stream       BIGINT NOT NULL,
    PRIMARY KEY (room_id, user_id, receipt_type, thread_id)
);
CREATE INDEX receipts_by_stream ON receipts (room_id, stream);

CREATE TABLE account_data (
    user_id    TEXT NOT NULL,
    -- '' for global account data
    room_id    TEXT NOT NULL,
    data_type  TEXT NOT NULL,
    content    TEXT NOT NULL,
    stream     BIGINT NOT NULL,
    PRIMARY KEY (user_id, room_id, data_type)
);
CREATE INDEX account_data_by_stream ON account_data (user_id, stream);

CREATE TABLE filters (
    user_id   TEXT NOT NULL,
    filter_id TEXT NOT NULL,
    filter    TEXT NOT NULL,
    PRIMARY KEY (user_id, filter_id)
);

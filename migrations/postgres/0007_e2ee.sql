-- End-to-end encryption plumbing: the server stores and hands out keys and
-- to-device messages; clients do the crypto.
CREATE TABLE device_keys (
    user_id   TEXT NOT NULL,
    device_id TEXT NOT NULL,
    keys      TEXT NOT NULL,
    PRIMARY KEY (user_id, device_id)
);

CREATE TABLE one_time_keys (
    user_id   TEXT NOT NULL,
    device_id TEXT NOT NULL,
    -- "<algorithm>:<key id>"
    key_id    TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    key       TEXT NOT NULL,
    PRIMARY KEY (user_id, device_id, key_id)
);

CREATE TABLE fallback_keys (
    user_id   TEXT NOT NULL,
    device_id TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    key_id    TEXT NOT NULL,
    key       TEXT NOT NULL,
    used      BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, device_id, algorithm)
);

CREATE TABLE cross_signing_keys (
    user_id  TEXT NOT NULL,
    -- master, self_signing, user_signing
    key_type TEXT NOT NULL,
    key      TEXT NOT NULL,
    PRIMARY KEY (user_id, key_type)
);

-- A user's devices or cross-signing keys changed at this stream position.
CREATE TABLE device_list_updates (
    user_id TEXT NOT NULL,
    stream  BIGINT NOT NULL,
    PRIMARY KEY (user_id, stream)
);
CREATE INDEX device_list_updates_by_stream ON device_list_updates (stream);

CREATE TABLE to_device (
    user_id    TEXT NOT NULL,
    device_id  TEXT NOT NULL,
    stream     BIGINT NOT NULL,
    sender     TEXT NOT NULL,
    event_type TEXT NOT NULL,
    content    TEXT NOT NULL,
    PRIMARY KEY (user_id, device_id, stream)
);

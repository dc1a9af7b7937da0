-- Other servers' signing keys, as fetched from their /_matrix/key/v2/server
-- (verified against their own signature first), one row per key. `json` is the
-- whole key object the origin signed, so the notary endpoint can hand it on
-- with our signature added. `expired_ts` is set for keys published under
-- old_verify_keys (valid for events sent before it).
CREATE TABLE server_keys (
    server_name    TEXT NOT NULL,
    key_id         TEXT NOT NULL,
    public_key     TEXT NOT NULL,
    valid_until_ts BIGINT NOT NULL,
    expired_ts     BIGINT,
    fetched_ts     BIGINT NOT NULL,
    json           TEXT NOT NULL,
    PRIMARY KEY (server_name, key_id)
);

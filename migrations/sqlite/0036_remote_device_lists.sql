-- Other servers' users' device lists, as their servers gave them
-- (`/user/devices/{userId}`) and kept current by their
-- `m.device_list_update` and `m.signing_key_update` EDUs. Kept only for
-- users who share a room with one of ours (else no update reaches us).
-- `stale`: an update came whose `prev_id` we did not hold, or the user may
-- have begun to share a room with us again (a membership moved): the next
-- key query asks their server again. `devices` is a JSON object, device id
-- -> { "keys": ..., "device_display_name": ... }.
CREATE TABLE remote_device_lists (
    user_id          TEXT PRIMARY KEY,
    stream_id        BIGINT NOT NULL,
    stale            BIGINT NOT NULL DEFAULT 0,
    devices          TEXT NOT NULL,
    master_key       TEXT,
    self_signing_key TEXT
);

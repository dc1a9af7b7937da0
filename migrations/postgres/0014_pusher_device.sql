-- A pusher lives as long as the access token that set it: it names that
-- token's device and goes when the device does (logout, logout/all, device
-- deletion, a password change that logs devices out; ON DELETE CASCADE). A new
-- token for the same device (a login naming it) removes it too
-- (storage::devices::login). Pushers stored before this migration name no
-- device and cannot be tied to one: they are dropped; clients set theirs
-- again when they start.
DROP TABLE pushers;
CREATE TABLE pushers (
    user_id   TEXT NOT NULL,
    device_id TEXT NOT NULL,
    app_id    TEXT NOT NULL,
    pushkey   TEXT NOT NULL,
    -- the pusher as the client set it (JSON)
    pusher    TEXT NOT NULL,
    PRIMARY KEY (user_id, app_id, pushkey),
    FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id) ON DELETE CASCADE
);
CREATE INDEX pushers_device ON pushers (user_id, device_id);

-- Accounts, devices (each holding at most one access token) and
-- user-interactive-auth sessions.
CREATE TABLE users (
    user_id       TEXT PRIMARY KEY NOT NULL,
    localpart     TEXT NOT NULL UNIQUE,
    password_hash TEXT,
    is_admin      INTEGER NOT NULL DEFAULT 0,
    deactivated   INTEGER NOT NULL DEFAULT 0,
    created_ts    INTEGER NOT NULL
);

CREATE TABLE devices (
    user_id      TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
    device_id    TEXT NOT NULL,
    display_name TEXT,
    -- sha-256 of the access token, hex; NULL once logged out.
    token_hash   TEXT UNIQUE,
    created_ts   INTEGER NOT NULL,
    last_seen_ts INTEGER,
    last_seen_ip TEXT,
    PRIMARY KEY (user_id, device_id)
);

CREATE TABLE uia_sessions (
    session_id TEXT PRIMARY KEY NOT NULL,
    -- what the session authorises: "register", "password", "delete_devices", ...
    purpose    TEXT NOT NULL,
    user_id    TEXT,
    -- JSON array of completed stage types
    completed  TEXT NOT NULL DEFAULT '[]',
    created_ts INTEGER NOT NULL
);

-- Server-side room key backup: each user's backup versions (the newest one
-- not deleted is the current one) and the encrypted session keys stored in
-- them. The server never sees a key: session_data is opaque to it.
CREATE TABLE backup_versions (
    user_id   TEXT NOT NULL,
    version   BIGINT NOT NULL,
    algorithm TEXT NOT NULL,
    -- auth_data, as JSON text
    auth_data TEXT NOT NULL,
    -- bumped whenever the keys stored in this version change
    etag      BIGINT NOT NULL DEFAULT 0,
    deleted   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, version)
);

CREATE TABLE backup_keys (
    user_id             TEXT NOT NULL,
    version             BIGINT NOT NULL,
    room_id             TEXT NOT NULL,
    session_id          TEXT NOT NULL,
    first_message_index BIGINT NOT NULL,
    forwarded_count     BIGINT NOT NULL,
    is_verified         INTEGER NOT NULL,
    -- the whole KeyBackupData object, as JSON text
    key_data            TEXT NOT NULL,
    PRIMARY KEY (user_id, version, room_id, session_id)
);

-- Invites of our users into rooms on other servers (rooms we are not in):
-- the invite as both servers signed it, the stripped state the inviting
-- server sent (client format, for the invitee's /sync), the inviting server
-- (where a join or a rejection goes first). `stream` is the position of the
-- last change, so an incremental /sync sees it once; `rejected` rows say
-- that the invitee turned the invite down (shown once under `leave`).
CREATE TABLE remote_invites (
    user_id        TEXT NOT NULL,
    room_id        TEXT NOT NULL,
    event_id       TEXT NOT NULL,
    room_version   TEXT NOT NULL,
    json           TEXT NOT NULL,
    stripped_state TEXT NOT NULL,
    via            TEXT NOT NULL,
    stream         BIGINT NOT NULL,
    rejected       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, room_id)
);
CREATE INDEX remote_invites_by_stream ON remote_invites (user_id, stream);

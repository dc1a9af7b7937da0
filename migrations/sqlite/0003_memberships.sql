-- Membership ranges: what each user may read is a set of ranges on the room's
-- seq line. One row per stay (kind 'join': the join event .. the event that
-- ended it) and one per invite (kind 'invite'), kept after they end.
CREATE TABLE memberships (
    room_id    TEXT NOT NULL REFERENCES rooms (room_id),
    user_id    TEXT NOT NULL,
    kind       TEXT NOT NULL,
    -- the seq of the join / invite event
    min_seq    INTEGER NOT NULL,
    -- the seq of the event that ended it (leave, kick, ban; for an invite also
    -- the join); NULL while it lasts
    max_seq    INTEGER,
    -- join rows: the first seq this stay may read through the pre-join window
    -- (org.seqline.prejoin_window at join time); equals min_seq without one
    window_seq INTEGER NOT NULL,
    PRIMARY KEY (room_id, user_id, kind, min_seq)
);
CREATE INDEX memberships_by_user ON memberships (user_id, room_id);
-- who holds a new seq: the rows still open
CREATE INDEX memberships_open ON memberships (room_id, max_seq);

-- A user's own floor in a room ("clear my history"): nothing below it is
-- returned to them, on any device.
CREATE TABLE user_room_floors (
    room_id   TEXT NOT NULL,
    user_id   TEXT NOT NULL,
    floor_seq INTEGER NOT NULL,
    PRIMARY KEY (room_id, user_id)
);

-- Rooms a user has forgotten (after leaving).
CREATE TABLE forgotten_rooms (
    user_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    PRIMARY KEY (user_id, room_id)
);

-- The room's floor: nothing below it is returned to anyone (purge).
ALTER TABLE rooms ADD COLUMN floor_seq INTEGER NOT NULL DEFAULT 0;

-- m.room.retention: find the first seq young enough to keep.
CREATE INDEX events_by_ts ON events (room_id, origin_server_ts);

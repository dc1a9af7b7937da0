-- Rooms and their seq lines. Every event accepted into a room's timeline takes
-- the room's next seq (rooms.last_seq + 1) in the transaction that stores it.
CREATE TABLE rooms (
    room_id      TEXT PRIMARY KEY NOT NULL,
    room_version TEXT NOT NULL,
    creator      TEXT NOT NULL,
    -- head of the seq line: the seq of the newest event
    last_seq     BIGINT NOT NULL DEFAULT 0,
    -- JSON array of the event ids new local events point at (prev_events)
    extremities  TEXT NOT NULL DEFAULT '[]',
    max_depth    BIGINT NOT NULL DEFAULT 0,
    -- listed in the public room directory
    published    BIGINT NOT NULL DEFAULT 0,
    created_ts   BIGINT NOT NULL
);

CREATE TABLE events (
    room_id          TEXT NOT NULL REFERENCES rooms (room_id),
    seq              BIGINT NOT NULL,
    event_id         TEXT NOT NULL UNIQUE,
    event_type       TEXT NOT NULL,
    state_key        TEXT,
    sender           TEXT NOT NULL,
    origin_server_ts BIGINT NOT NULL,
    -- the full signed PDU as sent; redaction is applied when serving
    json             TEXT NOT NULL,
    -- the accepted m.room.redaction that redacts this event
    redacted_by      TEXT,
    -- the sending device and its transaction id, for unsigned.transaction_id
    txn_device_id    TEXT,
    txn_id           TEXT,
    PRIMARY KEY (room_id, seq)
);
CREATE INDEX events_state_by_seq ON events (room_id, event_type, state_key, seq);

-- The current state of each room: (type, state_key) -> event.
CREATE TABLE room_state (
    room_id    TEXT NOT NULL REFERENCES rooms (room_id),
    event_type TEXT NOT NULL,
    state_key  TEXT NOT NULL,
    event_id   TEXT NOT NULL,
    -- for m.room.member: content.membership, so "who is joined" is one index scan
    membership TEXT,
    seq        BIGINT NOT NULL,
    PRIMARY KEY (room_id, event_type, state_key)
);
CREATE INDEX room_state_members ON room_state (event_type, state_key, membership);

-- Idempotent sends: one event per (device, scope, txn id).
CREATE TABLE txn_ids (
    user_id    TEXT NOT NULL,
    device_id  TEXT NOT NULL,
    scope      TEXT NOT NULL,
    txn_id     TEXT NOT NULL,
    event_id   TEXT NOT NULL,
    created_ts BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, scope, txn_id)
);

CREATE TABLE room_aliases (
    alias      TEXT PRIMARY KEY NOT NULL,
    room_id    TEXT NOT NULL REFERENCES rooms (room_id),
    creator    TEXT NOT NULL,
    created_ts BIGINT NOT NULL
);
CREATE INDEX room_aliases_by_room ON room_aliases (room_id);

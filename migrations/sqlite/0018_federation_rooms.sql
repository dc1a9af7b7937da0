-- Which servers are in each room now: per server, how many of its users are
-- joined in the current state. Kept by the write path in the transaction of
-- every membership change; a server is in the room while joined > 0. Decides
-- where our events are sent and which servers may ask about the room.
CREATE TABLE room_servers (
    room_id     TEXT NOT NULL REFERENCES rooms (room_id),
    server_name TEXT NOT NULL,
    joined      INTEGER NOT NULL,
    PRIMARY KEY (room_id, server_name)
);
INSERT INTO room_servers (room_id, server_name, joined)
SELECT room_id, substr(state_key, instr(state_key, ':') + 1), COUNT(*)
FROM room_state WHERE event_type = 'm.room.member' AND membership = 'join'
GROUP BY room_id, substr(state_key, instr(state_key, ':') + 1);

-- The server part of each range row's user, so a server's rows (the union
-- that decides what it may be sent) are one index scan.
ALTER TABLE memberships ADD COLUMN server_name TEXT NOT NULL DEFAULT '';
UPDATE memberships SET server_name = substr(user_id, instr(user_id, ':') + 1);
CREATE INDEX memberships_by_server ON memberships (room_id, server_name);

-- The outgoing queue: one row per (destination, event) to send, written in
-- the transaction that stores the event, deleted once the destination has
-- accepted the transaction that carried it. `txn_id` is set when a
-- transaction takes the row: a retry sends exactly the same rows under the
-- same id.
CREATE TABLE fed_outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    destination TEXT NOT NULL,
    room_id     TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    txn_id      TEXT
);
CREATE INDEX fed_outbox_by_destination ON fed_outbox (destination, id);

-- Per destination: when it may be tried again after failures.
CREATE TABLE fed_destinations (
    server_name TEXT PRIMARY KEY NOT NULL,
    failures    INTEGER NOT NULL DEFAULT 0,
    retry_at    BIGINT NOT NULL DEFAULT 0
);

-- Transactions received, with the answer given: a retried transaction gets
-- the same answer and changes nothing. Kept a day.
CREATE TABLE fed_inbound_txns (
    origin   TEXT NOT NULL,
    txn_id   TEXT NOT NULL,
    response TEXT NOT NULL,
    ts       BIGINT NOT NULL,
    PRIMARY KEY (origin, txn_id)
);

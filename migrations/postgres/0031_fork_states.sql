-- The state after an event that stood on a fork of the room's graph, where
-- it differs from the room's state at the event's position (`state_runs`
-- keeps the room's current state as it was after each position; an event
-- on a side branch saw another state). One row per differing key;
-- state_event_id NULL: the key was absent in the event's state.
CREATE TABLE fork_states (
    event_id       TEXT NOT NULL,
    event_type     TEXT NOT NULL,
    state_key      TEXT NOT NULL,
    state_event_id TEXT,
    PRIMARY KEY (event_id, event_type, state_key)
);

-- Events kept off the line: soft-failed ones (they passed the rules against
-- their own auth events and the state before them, not against the room's
-- state when they came; rejected_reason NULL) and rejected ones (they failed
-- the rules against their auth events or the state before them; the reason
-- kept). Held as outliers, never placed; base_seq is the position whose
-- state, with the event's fork_states rows over it, is the state after the
-- event, for events that name it as a prev event.
CREATE TABLE off_line_events (
    event_id        TEXT PRIMARY KEY NOT NULL,
    room_id         TEXT NOT NULL,
    base_seq        BIGINT NOT NULL,
    rejected_reason TEXT
);

-- Holes in the middle of a room's line: an event placed at seq whose prev
-- events we could not get (missing_prevs, a JSON array of ids); its state
-- came from the server that sent it (/state_ids). Backfill into the hole
-- will place what lies between.
CREATE TABLE timeline_gaps (
    room_id       TEXT NOT NULL,
    seq           BIGINT NOT NULL,
    event_id      TEXT NOT NULL,
    missing_prevs TEXT NOT NULL,
    PRIMARY KEY (room_id, seq)
);

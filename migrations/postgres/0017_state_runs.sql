-- Storage for federation (docs/federation-storage.md): the state at every
-- placed position, events held off the line (outliers), and the DAG edges.

-- The state after each placed event, run-length encoded: a row at seq s for
-- (type, state_key) iff the state after the event at s differs in that key
-- from the state at the previous placed position. event_id NULL = the key is
-- absent from then on. "State as of seq" is, per key, the latest row at or
-- below it: one seek in the primary key. On a linear room this is one row per
-- state event.
CREATE TABLE state_runs (
    room_id    TEXT NOT NULL REFERENCES rooms (room_id),
    event_type TEXT NOT NULL,
    state_key  TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    event_id   TEXT,
    PRIMARY KEY (room_id, event_type, state_key, seq)
);
-- The state changes of a stretch of the line, in order (incremental /sync).
CREATE INDEX state_runs_by_seq ON state_runs (room_id, seq, event_type, state_key, event_id);

INSERT INTO state_runs (room_id, event_type, state_key, seq, event_id)
    SELECT room_id, event_type, state_key, seq, event_id FROM events WHERE state_key IS NOT NULL;

-- Replaced by state_runs (its primary key and state_runs_by_seq).
DROP INDEX events_state_by_seq;
DROP INDEX events_state_changes;

-- Events we hold that are not on any room's line: the auth chain and state
-- from a send_join answer, remote invites, out-of-band leaves. No foreign key
-- to rooms: an invite names a room we are not in.
CREATE TABLE outliers (
    event_id         TEXT PRIMARY KEY NOT NULL,
    room_id          TEXT NOT NULL,
    event_type       TEXT NOT NULL,
    state_key        TEXT,
    sender           TEXT NOT NULL,
    origin_server_ts BIGINT NOT NULL,
    -- the full signed PDU as received
    json             TEXT NOT NULL,
    received_ts      BIGINT NOT NULL
);
CREATE INDEX outliers_by_room ON outliers (room_id, event_type, state_key);

-- The DAG: prev_events of every placed event, auth_events of every placed
-- event and outlier. The ids named need not be held.
CREATE TABLE event_edges (
    event_id TEXT NOT NULL,
    prev_id  TEXT NOT NULL,
    PRIMARY KEY (event_id, prev_id)
);
CREATE INDEX event_edges_by_prev ON event_edges (prev_id);

CREATE TABLE event_auth_edges (
    event_id TEXT NOT NULL,
    auth_id  TEXT NOT NULL,
    PRIMARY KEY (event_id, auth_id)
);

-- Room versions 1 and 2 list [event_id, hashes] pairs, later ones bare ids.
-- PostgreSQL refuses to parse a \u0000 escape (which a message body may carry):
-- it is neutralised first; ids never contain one.
INSERT INTO event_edges (event_id, prev_id)
    SELECT event_id, id FROM (
        SELECT e.event_id,
               CASE json_typeof(p) WHEN 'array' THEN p ->> 0 WHEN 'string' THEN p #>> '{}' END AS id
        FROM events e
        CROSS JOIN LATERAL (SELECT replace(e.json, '\u0000', '\ufffd')::json -> 'prev_events' AS list) l
        CROSS JOIN LATERAL json_array_elements(
            CASE WHEN json_typeof(l.list) = 'array' THEN l.list ELSE '[]'::json END) p
    ) edges WHERE id IS NOT NULL
    ON CONFLICT DO NOTHING;
INSERT INTO event_auth_edges (event_id, auth_id)
    SELECT event_id, id FROM (
        SELECT e.event_id,
               CASE json_typeof(p) WHEN 'array' THEN p ->> 0 WHEN 'string' THEN p #>> '{}' END AS id
        FROM events e
        CROSS JOIN LATERAL (SELECT replace(e.json, '\u0000', '\ufffd')::json -> 'auth_events' AS list) l
        CROSS JOIN LATERAL json_array_elements(
            CASE WHEN json_typeof(l.list) = 'array' THEN l.list ELSE '[]'::json END) p
    ) edges WHERE id IS NOT NULL
    ON CONFLICT DO NOTHING;

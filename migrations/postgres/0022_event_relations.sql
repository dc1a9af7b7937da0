-- Relations between events (client-server API, "Forming relationships
-- between events"): one row per event whose content carries an
-- `m.relates_to` with a string `rel_type` and a string `event_id`. The child
-- is keyed by its event id (an event relates to at most one parent) and keeps
-- its room and its position on the room's seq line (`events.seq`), so every
-- reader filters the rows by the caller's readable ranges before it uses
-- them. A redacted child loses its `m.relates_to` (no room version keeps it),
-- so redacting it deletes its row. Running this again (a test's database
-- taken back to before 0020) keeps what is there and adds what is missing.
CREATE TABLE IF NOT EXISTS event_relations (
    event_id      TEXT PRIMARY KEY NOT NULL,
    room_id       TEXT NOT NULL,
    relates_to_id TEXT NOT NULL,
    rel_type      TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    sender        TEXT NOT NULL,
    seq           BIGINT NOT NULL
);
-- /relations, bundled aggregations: one parent's children of a type, in order.
CREATE INDEX IF NOT EXISTS event_relations_by_parent ON event_relations (room_id, relates_to_id, rel_type, seq);
-- /threads: a room's thread replies by thread.
CREATE INDEX IF NOT EXISTS event_relations_by_type ON event_relations (room_id, rel_type, relates_to_id, seq);

-- PostgreSQL's JSON functions refuse an escaped NUL (`\u0000`), which a PDU
-- from another server may hold anywhere: such an event's relation is not
-- recovered here (the CASE keeps the parser off it; SQLite recovers it). A
-- relation whose own strings hold NUL is left out on both backends and by
-- the write path (TEXT cannot hold NUL).
INSERT INTO event_relations (event_id, room_id, relates_to_id, rel_type, event_type, sender, seq)
SELECT event_id, room_id, rel ->> 'event_id', rel ->> 'rel_type', event_type, sender, seq
FROM (
    SELECT event_id, room_id, event_type, sender, seq,
           CASE WHEN strpos(json, '\u0000') = 0 THEN json::json -> 'content' -> 'm.relates_to' END AS rel
    FROM events
    WHERE redacted_by IS NULL
) AS e
WHERE json_typeof(rel -> 'rel_type') = 'string'
  AND json_typeof(rel -> 'event_id') = 'string'
  AND (rel ->> 'event_id') LIKE '$%'
  AND length(rel ->> 'rel_type') BETWEEN 1 AND 255
ON CONFLICT (event_id) DO NOTHING;

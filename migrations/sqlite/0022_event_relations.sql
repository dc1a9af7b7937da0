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
    seq           INTEGER NOT NULL
);
-- /relations, bundled aggregations: one parent's children of a type, in order.
CREATE INDEX IF NOT EXISTS event_relations_by_parent ON event_relations (room_id, relates_to_id, rel_type, seq);
-- /threads: a room's thread replies by thread.
CREATE INDEX IF NOT EXISTS event_relations_by_type ON event_relations (room_id, rel_type, relates_to_id, seq);

INSERT INTO event_relations (event_id, room_id, relates_to_id, rel_type, event_type, sender, seq)
SELECT event_id, room_id,
       json_extract(json, '$.content."m.relates_to".event_id'),
       json_extract(json, '$.content."m.relates_to".rel_type'),
       event_type, sender, seq
FROM events
WHERE redacted_by IS NULL
  AND json_type(json, '$.content."m.relates_to".rel_type') = 'text'
  AND json_type(json, '$.content."m.relates_to".event_id') = 'text'
  AND json_extract(json, '$.content."m.relates_to".event_id') LIKE '$%'
  AND length(json_extract(json, '$.content."m.relates_to".rel_type')) BETWEEN 1 AND 255
  AND instr(json_extract(json, '$.content."m.relates_to".rel_type'), char(0)) = 0
  AND instr(json_extract(json, '$.content."m.relates_to".event_id'), char(0)) = 0
ON CONFLICT (event_id) DO NOTHING;

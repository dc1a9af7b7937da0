-- Server-side search (POST /search): the searchable text of each event, kept
-- by the write path in the transaction that stores the event
-- (storage::search::index, called from events::insert) and removed in the
-- transaction of its redaction, so redacted text is never found.
--
-- One row per searchable event: an m.room.message's content.body, an
-- m.room.name's content.name, an m.room.topic's content.topic (the spec's
-- search keys; the type says which). room_id, seq and stream copy the event's
-- row so that a search reads this table alone until it has its page: the
-- readable ranges are conditions on (room_id, seq), "recent" orders by stream.
-- tsv is the full-text vector ('english': stemmed, stop words dropped) under
-- a GIN index.
CREATE TABLE event_search (
    event_id     TEXT PRIMARY KEY NOT NULL,
    room_id      TEXT NOT NULL,
    seq          BIGINT NOT NULL,
    stream       BIGINT NOT NULL,
    event_type   TEXT NOT NULL,
    sender       TEXT NOT NULL,
    -- content.url is present (RoomEventFilter.contains_url)
    contains_url BIGINT NOT NULL,
    body         TEXT NOT NULL,
    tsv          tsvector GENERATED ALWAYS AS (to_tsvector('english'::regconfig, body)) STORED
);
CREATE INDEX event_search_by_room ON event_search (room_id, seq);
CREATE INDEX event_search_tsv ON event_search USING GIN (tsv);

-- The events stored so far (not redacted ones). An event whose JSON holds an
-- escaped NUL (\u0000), which PostgreSQL's jsonb refuses, is left out.
INSERT INTO event_search (event_id, room_id, seq, stream, event_type, sender, contains_url, body)
SELECT event_id, room_id, seq, stream, event_type, sender,
       CASE WHEN (json::jsonb -> 'content' -> 'url') IS NULL THEN 0 ELSE 1 END,
       json::jsonb -> 'content' ->> 'body'
FROM events
WHERE event_type = 'm.room.message' AND redacted_by IS NULL AND strpos(json, '\u0000') = 0
  AND jsonb_typeof(json::jsonb -> 'content' -> 'body') = 'string';
INSERT INTO event_search (event_id, room_id, seq, stream, event_type, sender, contains_url, body)
SELECT event_id, room_id, seq, stream, event_type, sender, 0, json::jsonb -> 'content' ->> 'name'
FROM events
WHERE event_type = 'm.room.name' AND state_key = '' AND redacted_by IS NULL AND strpos(json, '\u0000') = 0
  AND jsonb_typeof(json::jsonb -> 'content' -> 'name') = 'string';
INSERT INTO event_search (event_id, room_id, seq, stream, event_type, sender, contains_url, body)
SELECT event_id, room_id, seq, stream, event_type, sender, 0, json::jsonb -> 'content' ->> 'topic'
FROM events
WHERE event_type = 'm.room.topic' AND state_key = '' AND redacted_by IS NULL AND strpos(json, '\u0000') = 0
  AND jsonb_typeof(json::jsonb -> 'content' -> 'topic') = 'string';

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
CREATE TABLE event_search (
    id           INTEGER PRIMARY KEY,
    event_id     TEXT NOT NULL UNIQUE,
    room_id      TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    stream       INTEGER NOT NULL,
    event_type   TEXT NOT NULL,
    sender       TEXT NOT NULL,
    -- content.url is present (RoomEventFilter.contains_url)
    contains_url INTEGER NOT NULL,
    body         TEXT NOT NULL
);
CREATE INDEX event_search_by_room ON event_search (room_id, seq);

-- The full-text index (FTS5, built into the bundled SQLite) over body, its
-- content in event_search (external content: the text is stored once), kept
-- in step by the triggers below. Porter stemming over unicode61 words, as
-- PostgreSQL's 'english' configuration stems.
CREATE VIRTUAL TABLE event_search_fts USING fts5(
    body,
    content = 'event_search',
    content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER event_search_insert AFTER INSERT ON event_search BEGIN
    INSERT INTO event_search_fts (rowid, body) VALUES (new.id, new.body);
END;
CREATE TRIGGER event_search_delete AFTER DELETE ON event_search BEGIN
    INSERT INTO event_search_fts (event_search_fts, rowid, body) VALUES ('delete', old.id, old.body);
END;

-- The events stored so far (not redacted ones).
INSERT INTO event_search (event_id, room_id, seq, stream, event_type, sender, contains_url, body)
SELECT event_id, room_id, seq, stream, event_type, sender,
       json_type(json, '$.content.url') IS NOT NULL,
       json_extract(json, '$.content.body')
FROM events
WHERE event_type = 'm.room.message' AND redacted_by IS NULL
  AND json_type(json, '$.content.body') = 'text'
ORDER BY room_id, seq;
INSERT INTO event_search (event_id, room_id, seq, stream, event_type, sender, contains_url, body)
SELECT event_id, room_id, seq, stream, event_type, sender, 0, json_extract(json, '$.content.name')
FROM events
WHERE event_type = 'm.room.name' AND state_key = '' AND redacted_by IS NULL
  AND json_type(json, '$.content.name') = 'text';
INSERT INTO event_search (event_id, room_id, seq, stream, event_type, sender, contains_url, body)
SELECT event_id, room_id, seq, stream, event_type, sender, 0, json_extract(json, '$.content.topic')
FROM events
WHERE event_type = 'm.room.topic' AND state_key = '' AND redacted_by IS NULL
  AND json_type(json, '$.content.topic') = 'text';

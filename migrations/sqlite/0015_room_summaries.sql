-- What /publicRooms shows of each room, kept current by the write path in the
-- transaction of every state event that changes it (name, topic, avatar,
-- canonical alias, join rule, room type, history visibility, guest access) and
-- of every membership change (joined_members), so listing the directory reads
-- these rows instead of each published room's state.
CREATE TABLE room_summaries (
    room_id         TEXT PRIMARY KEY NOT NULL REFERENCES rooms (room_id),
    name            TEXT,
    topic           TEXT,
    avatar_url      TEXT,
    canonical_alias TEXT,
    join_rule       TEXT,
    room_type       TEXT,
    world_readable  INTEGER NOT NULL DEFAULT 0,
    guest_can_join  INTEGER NOT NULL DEFAULT 0,
    joined_members  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX room_summaries_by_members ON room_summaries (joined_members DESC, room_id);

-- The rooms that exist already, from their current state.
INSERT INTO room_summaries (room_id, name, topic, avatar_url, canonical_alias, join_rule, room_type,
                            world_readable, guest_can_join, joined_members)
SELECT r.room_id,
    (SELECT CASE WHEN json_type(e.json, '$.content.name') = 'text' THEN json_extract(e.json, '$.content.name') END FROM room_state s JOIN events e ON e.event_id = s.event_id
      WHERE s.room_id = r.room_id AND s.event_type = 'm.room.name' AND s.state_key = ''),
    (SELECT CASE WHEN json_type(e.json, '$.content.topic') = 'text' THEN json_extract(e.json, '$.content.topic') END FROM room_state s JOIN events e ON e.event_id = s.event_id
      WHERE s.room_id = r.room_id AND s.event_type = 'm.room.topic' AND s.state_key = ''),
    (SELECT CASE WHEN json_type(e.json, '$.content.url') = 'text' THEN json_extract(e.json, '$.content.url') END FROM room_state s JOIN events e ON e.event_id = s.event_id
      WHERE s.room_id = r.room_id AND s.event_type = 'm.room.avatar' AND s.state_key = ''),
    (SELECT CASE WHEN json_type(e.json, '$.content.alias') = 'text' THEN json_extract(e.json, '$.content.alias') END FROM room_state s JOIN events e ON e.event_id = s.event_id
      WHERE s.room_id = r.room_id AND s.event_type = 'm.room.canonical_alias' AND s.state_key = ''),
    (SELECT CASE WHEN json_type(e.json, '$.content.join_rule') = 'text' THEN json_extract(e.json, '$.content.join_rule') END FROM room_state s JOIN events e ON e.event_id = s.event_id
      WHERE s.room_id = r.room_id AND s.event_type = 'm.room.join_rules' AND s.state_key = ''),
    (SELECT CASE WHEN json_type(e.json, '$.content.type') = 'text' THEN json_extract(e.json, '$.content.type') END FROM room_state s JOIN events e ON e.event_id = s.event_id
      WHERE s.room_id = r.room_id AND s.event_type = 'm.room.create' AND s.state_key = ''),
    COALESCE(
    (SELECT CASE WHEN json_extract(e.json, '$.content.history_visibility') = 'world_readable' THEN 1 ELSE 0 END FROM room_state s JOIN events e ON e.event_id = s.event_id
          WHERE s.room_id = r.room_id AND s.event_type = 'm.room.history_visibility' AND s.state_key = ''), 0),
    COALESCE(
    (SELECT CASE WHEN json_extract(e.json, '$.content.guest_access') = 'can_join' THEN 1 ELSE 0 END FROM room_state s JOIN events e ON e.event_id = s.event_id
          WHERE s.room_id = r.room_id AND s.event_type = 'm.room.guest_access' AND s.state_key = ''), 0),
    (SELECT COUNT(*) FROM room_state m
      WHERE m.room_id = r.room_id AND m.event_type = 'm.room.member' AND m.membership = 'join')
FROM rooms r;

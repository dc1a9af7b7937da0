-- Unread counting reads the events from others since a user's receipt but
-- for member events about someone else, which the default rules leave
-- silent. In a room of many joins those are nearly every event; these two
-- indexes let the count read only the rest: the events that are not member
-- events, and the member events about one user. Each event is in exactly
-- one of them.
CREATE INDEX events_not_members ON events (room_id, seq) WHERE event_type <> 'm.room.member';
CREATE INDEX events_members_by_target ON events (room_id, state_key, seq) WHERE event_type = 'm.room.member';

-- The state events of a room in seq order, with their keys: an incremental
-- sync after a long gap reads the gap's state changes from here without
-- walking the gap's messages.
CREATE INDEX events_state_changes ON events (room_id, seq, event_type, state_key)
    WHERE state_key IS NOT NULL;

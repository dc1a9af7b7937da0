-- Unread counts from running totals kept at write time (docs/unread-counts.md).
-- Each event placed at the head that notifies under the default push rules
-- for a reader it does not name, or that some reader must look at themselves
-- (it names users in m.mentions, it is an invite, it has a body but no
-- m.mentions so the legacy name rules apply, it was redacted), has a row:
-- its thread ('' for the main timeline), what the default rules say of it
-- to a reader it does not name and to one it names, and the running totals
-- of its thread (of the first) up to and including it.
CREATE TABLE push_tally (
    room_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    thread TEXT NOT NULL,
    sender TEXT NOT NULL,
    notifies BIGINT NOT NULL,
    highlights BIGINT NOT NULL,
    -- 1: the legacy name rules read its body (words: its signature);
    -- 2: every reader evaluates it (redacted since, or an invite naming
    -- others too); 3: a redaction (counts before it may have moved).
    recheck BIGINT NOT NULL,
    words BIGINT NOT NULL,
    named_notifies BIGINT NOT NULL,
    named_highlights BIGINT NOT NULL,
    notify_n BIGINT NOT NULL,
    highlight_n BIGINT NOT NULL,
    PRIMARY KEY (room_id, seq)
);
CREATE INDEX push_tally_thread ON push_tally (room_id, thread, seq);
CREATE INDEX push_tally_sender ON push_tally (room_id, sender, seq);
-- Covering: legacy rows are told apart by their signature in the index.
CREATE INDEX push_tally_recheck ON push_tally (room_id, seq, recheck, words, sender) WHERE recheck > 0;

-- Each thread's totals and newest row: the top of push_tally per thread.
CREATE TABLE push_threads (
    room_id TEXT NOT NULL,
    thread TEXT NOT NULL,
    last_seq BIGINT NOT NULL,
    notify_n BIGINT NOT NULL,
    highlight_n BIGINT NOT NULL,
    PRIMARY KEY (room_id, thread)
);
CREATE INDEX push_threads_last ON push_threads (room_id, last_seq);

-- Our users an event names (m.mentions.user_ids, an invite's target).
CREATE TABLE push_mentions (
    room_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    PRIMARY KEY (room_id, user_id, seq)
);

-- Rooms that held events before the tally: their events up to this seq
-- have no rows and are counted by evaluating each.
CREATE TABLE push_floor (
    room_id TEXT NOT NULL PRIMARY KEY,
    seq BIGINT NOT NULL
);
INSERT INTO push_floor (room_id, seq) SELECT room_id, MAX(seq) FROM events GROUP BY room_id;

-- Redactions whose target was not held when they were placed (a backfilled
-- redaction lies above its target, which a later backfill brings): when the
-- target is placed, the redaction is checked and applied then.
CREATE TABLE pending_redactions (
    target_id    TEXT NOT NULL,
    redaction_id TEXT NOT NULL,
    room_id      TEXT NOT NULL,
    PRIMARY KEY (target_id, redaction_id)
);

-- EDUs queued for other servers (typing, receipts, presence), next to the
-- PDUs of fed_outbox and sent in the same transactions. `ekey` names what
-- an EDU is about (a user typing in a room, a user's receipt of one type in
-- one thread, a user's presence): a newer one replaces the one not yet
-- taken into a transaction, so a destination that is away gets the last
-- word, not every keystroke.
CREATE TABLE fed_edu_outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    destination TEXT NOT NULL,
    ekey        TEXT NOT NULL,
    edu         TEXT NOT NULL,
    txn_id      TEXT
);
CREATE INDEX fed_edu_outbox_by_destination ON fed_edu_outbox (destination, id);
CREATE INDEX fed_edu_outbox_by_key ON fed_edu_outbox (destination, ekey);

-- Moves whenever what members may read in the room changes other than by the
-- head moving on: a state event (membership, history visibility, retention),
-- a purge, a user's own floor. Every process reads it with the room's row, so
-- what was worked out from those inputs can be reused while it stands still.
ALTER TABLE rooms ADD COLUMN read_epoch INTEGER NOT NULL DEFAULT 0;

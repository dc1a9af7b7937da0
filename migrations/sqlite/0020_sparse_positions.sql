-- Sparse positions on each room's seq line (docs/federation-storage.md,
-- src/room/position.rs): the first event sits at ORIGIN = 2^62 and each next
-- one STEP = 2^20 above the last, leaving room below the first (backfill) and
-- between neighbours (holes) without renumbering. Every dense seq S >= 1
-- becomes ORIGIN + (S - 1) * STEP: the map is increasing, so every order,
-- range and floor comparison answers as before. 0 means "no position" and
-- stays 0: rooms.last_seq of an empty room, a floor that hides nothing.
--
-- Every new value is >= 2^62 and every old one far below it, so no row can
-- take a key another row still holds, in whatever order the rows are updated
-- (unique keys are checked row by row on both backends).
UPDATE events SET seq = 4611686018427387904 + (seq - 1) * 1048576 WHERE seq > 0;
UPDATE room_state SET seq = 4611686018427387904 + (seq - 1) * 1048576 WHERE seq > 0;
UPDATE state_runs SET seq = 4611686018427387904 + (seq - 1) * 1048576 WHERE seq > 0;
UPDATE memberships SET
    min_seq = CASE WHEN min_seq > 0 THEN 4611686018427387904 + (min_seq - 1) * 1048576 ELSE min_seq END,
    max_seq = CASE WHEN max_seq > 0 THEN 4611686018427387904 + (max_seq - 1) * 1048576 ELSE max_seq END,
    window_seq = CASE WHEN window_seq > 0 THEN 4611686018427387904 + (window_seq - 1) * 1048576 ELSE window_seq END;
UPDATE user_room_floors SET floor_seq = 4611686018427387904 + (floor_seq - 1) * 1048576 WHERE floor_seq > 0;
-- A floor of last_seq + 1 ("nothing so far") becomes ORIGIN + last_seq * STEP:
-- exactly where the next event will be placed, so that event is readable.
UPDATE rooms SET
    last_seq = CASE WHEN last_seq > 0 THEN 4611686018427387904 + (last_seq - 1) * 1048576 ELSE last_seq END,
    floor_seq = CASE WHEN floor_seq > 0 THEN 4611686018427387904 + (floor_seq - 1) * 1048576 ELSE floor_seq END,
    read_epoch = read_epoch + 1;

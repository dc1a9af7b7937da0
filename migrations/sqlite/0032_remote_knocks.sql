-- Knocks of our users on rooms on other servers live next to their remote
-- invites (one pending membership per user and room, which the host's
-- invite replaces): `membership` says which a row is.
ALTER TABLE remote_invites ADD COLUMN membership TEXT NOT NULL DEFAULT 'invite';

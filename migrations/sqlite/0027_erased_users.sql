-- Accounts deactivated with `erase: true`: their messages are served
-- redacted to everyone who was not joined when they were sent.
ALTER TABLE users ADD COLUMN erased INTEGER NOT NULL DEFAULT 0;

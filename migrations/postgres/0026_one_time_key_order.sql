-- One-time keys are handed out in the order they were uploaded (MSC4225):
-- each upload numbers its keys after the device's last.
ALTER TABLE one_time_keys ADD COLUMN upload_order BIGINT NOT NULL DEFAULT 0;

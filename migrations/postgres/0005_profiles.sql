-- Profile fields (displayname, avatar_url and custom fields), one row each,
-- the value as JSON.
CREATE TABLE profile_fields (
    user_id TEXT NOT NULL,
    field   TEXT NOT NULL,
    value   TEXT NOT NULL,
    PRIMARY KEY (user_id, field)
);

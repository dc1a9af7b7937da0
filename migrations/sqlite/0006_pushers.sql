-- HTTP pushers, one per (user, app, pushkey).
CREATE TABLE pushers (
    user_id TEXT NOT NULL,
    app_id  TEXT NOT NULL,
    pushkey TEXT NOT NULL,
    -- the pusher as the client set it (JSON)
    pusher  TEXT NOT NULL,
    PRIMARY KEY (user_id, app_id, pushkey)
);

-- Signatures uploaded through /keys/signatures/upload, one row per signer and
-- signing key, kept apart from the signed key's own JSON: a device re-uploading
-- its keys or another signer signing the same key never drops a signature.
-- The target is a device (target_key_id = device id) or a cross-signing key
-- (target_key_id = its unpadded base64 public key).
CREATE TABLE key_signatures (
    target_user_id TEXT NOT NULL,
    target_key_id  TEXT NOT NULL,
    signer_user_id TEXT NOT NULL,
    -- "ed25519:<device id or public key>"
    signer_key_id  TEXT NOT NULL,
    signature      TEXT NOT NULL,
    PRIMARY KEY (target_user_id, target_key_id, signer_user_id, signer_key_id)
);
CREATE INDEX key_signatures_by_signer ON key_signatures (signer_user_id, signer_key_id);

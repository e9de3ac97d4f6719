-- A credential may be limited in uses (a provisioning credential limited to
-- so many registrations): max_uses is the limit, 0 for none, and uses the
-- uses counted so far. Existing credentials have no limit. The DEFAULT
-- only fills existing rows: bun writes these int64 columns as values.
ALTER TABLE nodelane_credentials ADD COLUMN IF NOT EXISTS max_uses BIGINT NOT NULL DEFAULT 0;
--bun:split
ALTER TABLE nodelane_credentials ADD COLUMN IF NOT EXISTS uses BIGINT NOT NULL DEFAULT 0;
--bun:split
-- A ban follows a node's key: registration looks up every principal that
-- holds the key being registered.
CREATE INDEX IF NOT EXISTS nodelane_principals_key_idx ON nodelane_principals (key_id);

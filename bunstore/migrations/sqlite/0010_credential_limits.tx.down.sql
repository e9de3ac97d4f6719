DROP INDEX IF EXISTS nodelane_principals_key_idx;
--bun:split
ALTER TABLE nodelane_credentials DROP COLUMN uses;
--bun:split
ALTER TABLE nodelane_credentials DROP COLUMN max_uses;

CREATE INDEX IF NOT EXISTS nodelane_credentials_principal_idx ON nodelane_credentials (principal_id);
--bun:split
DROP INDEX IF EXISTS nodelane_credentials_principal_id_idx;

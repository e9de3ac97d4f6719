-- GET /operator/credentials?principal= pages one principal's credentials
-- in id order: an index on (principal_id, id) reads each page in order
-- and stops at its limit, however many credentials the principal has. It
-- serves every lookup by principal_id too, so it replaces the index on
-- principal_id alone.
CREATE INDEX IF NOT EXISTS nodelane_credentials_principal_id_idx ON nodelane_credentials (principal_id, id);
--bun:split
DROP INDEX IF EXISTS nodelane_credentials_principal_idx;

DROP TABLE IF EXISTS nodelane_credentials;
--bun:split
DROP TABLE IF EXISTS nodelane_principals;
